//! Connections: joining, leaving (their subscriptions removed, their id kept until the
//! session ends), the publisher quotas they are charged to.

use super::*;

impl<O: Outbox> Engine<O> {
    /// Publishes from connection `conn` are charged to `origin` (its token's subject).
    pub fn set_origin(&mut self, conn: ConnId, origin: Origin) {
        if let Some(c) = self.conns.get_mut(conn as usize).and_then(Option::as_mut) {
            c.origin = origin;
        }
    }

    /// What `origin`'s topics hold.
    pub fn usage(&self, origin: Origin) -> Usage {
        self.usage.get(origin as usize).copied().unwrap_or_default()
    }

    pub fn connect(&mut self, outbox: O) -> ConnId {
        let conn = Some(Conn {
            outbox,
            subs: Vec::new(),
            explicit: 0,
            seen: 0,
            origin: 0,
            no_local: 0,
        });
        match self.free.pop() {
            Some(id) => {
                self.conns[id as usize] = conn;
                id
            }
            None => {
                self.conns.push(conn);
                (self.conns.len() - 1) as ConnId
            }
        }
    }

    /// Removes a connection and all its subscriptions, returning its outbox.
    pub fn disconnect(&mut self, id: ConnId) -> Option<O> {
        self.detach(id);
        let conn = self.conns.get_mut(id as usize)?.take()?;
        self.free.push(id);
        Some(conn.outbox)
    }

    /// Removes every subscription of a connection that is being closed, so that nothing more
    /// is delivered to it and no publisher waits for it, while its id stays taken until
    /// [`Engine::disconnect`].
    pub fn detach(&mut self, id: ConnId) {
        self.leave_groups(id);
        self.snapshots.cancel(id, None);
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        let subs = std::mem::take(&mut conn.subs);
        conn.explicit = 0;
        conn.no_local = 0;
        for sub in subs {
            self.index.remove(&sub.pattern, id);
            self.interest_down(&sub.pattern);
            self.subscriptions -= 1;
            self.lossless -= usize::from(sub.is_lossless());
        }
    }

    /// A connection's outbox, if it is connected.
    pub fn outbox(&self, id: ConnId) -> Option<&O> {
        self.conn(id).map(|c| &c.outbox)
    }

    /// Gives back the spare room of a connection's subscription list, once a burst of
    /// subscribes is over: grown by doubling, 100 subscriptions would keep room for 128, about
    /// a kilobyte per connection held for its whole life.
    pub fn trim(&mut self, id: ConnId) {
        let Some(conn) = self.conns.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        if conn.subs.capacity() > conn.subs.len() {
            // Moved to a list of the exact size rather than `shrink_to_fit`: mimalloc keeps a
            // block shrunk by less than half where it is, whole.
            let mut exact = Vec::with_capacity(conn.subs.len());
            exact.append(&mut conn.subs);
            conn.subs = exact;
        }
    }

    pub fn connections(&self) -> impl Iterator<Item = &O> {
        self.conns.iter().flatten().map(|c| &c.outbox)
    }

    pub fn connection_count(&self) -> usize {
        self.conns.len() - self.free.len()
    }

    #[inline]
    pub(super) fn conn(&self, id: ConnId) -> Option<&Conn<O>> {
        self.conns.get(id as usize).and_then(Option::as_ref)
    }
}
