// Compiled (never run) by types.test.js against the generated declarations: every line after an
// expect-error directive must be a type error, every other line must type-check.
import { connect, HeraldError } from "../types/herald-client.js";
import type { Ack, Subscription, ResubscribedEvent } from "../types/herald-client.js";

export async function usage(): Promise<void> {
  const c = connect("ws://127.0.0.1:8080/ws");
  const acked: Ack = await c.publish("a/b", "x");
  const stamped: Ack = await c.publish("a/b", { v: 1 }, { stamp: true, ct: "application/json" });
  const unacked: undefined = await c.publish("a/b", "x", { ack: false });
  // @ts-expect-error: with ack: false there is no acknowledgement
  const notAcked: Ack = await c.publish("a/b", "x", { ack: false });
  const either: Ack | undefined = await c.publish("a/b", "x", { ack: Math.random() > 0.5 });
  await c.publish("a/b", new Uint8Array(4), { signal: AbortSignal.timeout(1000) });
  await c.ping({ signal: new AbortController().signal });
  const sub: Subscription = c.subscribe("a/>", (m) => void m.text(), { policy: "drop" });
  const cursor: string | undefined = (await sub.ready).cursor;
  await sub.unsubscribe();
  const off = c.on("resubscribed", (r: ResubscribedEvent) => void r.recovered);
  off();
  c.once("error", (e: HeraldError) => void e.code);
  c.off("state", () => {});
  // @ts-expect-error: the client's internals are not part of its API
  c.receive("{}");
  // @ts-expect-error
  void c.pending;
  // @ts-expect-error
  void c.credits;
  // @ts-expect-error
  c.deliver;
  // @ts-expect-error: a subscription's bookkeeping is internal
  void sub.positions;
  void [acked, stamped, unacked, notAcked, either, cursor];
}
