package herald.stomp;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/**
 * A self-signed certificate for 127.0.0.1 and its key (PEM files, as herald's
 * {@code --tls-cert-file} and {@code --tls-key-file} take them), made with the openssl command,
 * and the {@link SSLContext} of a client that trusts exactly that certificate.
 */
record Certificate(Path cert, Path key) {
    /** Makes the certificate and key in {@code dir}. */
    static Certificate selfSigned(Path dir) throws Exception {
        Path cert = dir.resolve("cert.pem");
        Path key = dir.resolve("key.pem");
        Process p = new ProcessBuilder("openssl", "req", "-x509",
                "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", key.toString(), "-out", cert.toString(), "-days", "1",
                "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost")
                .redirectErrorStream(true)
                .start();
        if (!p.waitFor(Herald.STARTUP_SECONDS, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            fail("openssl did not make the certificate within " + Herald.STARTUP_SECONDS + " s");
        }
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertEquals(0, p.exitValue(), "openssl req -x509:\n" + out);
        return new Certificate(cert, key);
    }

    /** A TLS client context whose only trust anchor is this certificate. */
    SSLContext trustingIt() throws Exception {
        KeyStore trusted = KeyStore.getInstance(KeyStore.getDefaultType());
        trusted.load(null, null);
        try (InputStream in = Files.newInputStream(cert)) {
            trusted.setCertificateEntry("herald", CertificateFactory.getInstance("X.509").generateCertificate(in));
        }
        TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
        tmf.init(trusted);
        SSLContext context = SSLContext.getInstance("TLS");
        context.init(null, tmf.getTrustManagers(), null);
        return context;
    }
}
