//! Group subscriptions: subscriptions that share one stream of messages, each message going
//! to one member of the group rather than to every subscriber (MQTT's shared subscriptions,
//! a STOMP or JMS queue).
//!
//! A group is named by its name and its pattern together ([`Group`]): connections that
//! subscribe with the same two are its members. Each message the pattern matches goes to the
//! next member in turn that can take it now (its queue has room for it, and a `lossless`
//! member has the credit), so a slow member is passed over rather than made to lose or hold
//! anything while another is free ([`Rotation::choose`]). Only when no member can take it
//! does it go to the member whose turn it is, which is then treated as any subscriber would
//! be that is behind: its policy decides.
//!
//! The engine keeps groups beside its connections' own subscriptions (`engine/groups.rs`); a
//! message delivered for a group names it ([`crate::outbox::OutboundQueue::deliver_grouped`]),
//! so that a protocol can tell which of its subscriptions it is for ([`crate::codec::Encode`]).

/// A group subscription's identity: what a delivery for it names, shared by refcount.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Group {
    pub name: Box<str>,
    pub pattern: Box<str>,
}

/// A group's members, taken in turn.
#[derive(Debug)]
pub struct Rotation<M> {
    members: Vec<M>,
    /// The member whose turn is next.
    next: usize,
}

impl<M> Default for Rotation<M> {
    fn default() -> Self {
        Rotation {
            members: Vec::new(),
            next: 0,
        }
    }
}

/// Whom a message goes to ([`Rotation::choose`]): an index into the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The first member in turn that can take it now.
    Ready(usize),
    /// No member can take it now: the member whose turn it is.
    Behind(usize),
}

impl<M> Rotation<M> {
    pub fn members(&self) -> &[M] {
        &self.members
    }

    pub fn members_mut(&mut self) -> &mut [M] {
        &mut self.members
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// A new member, last in turn: the member whose turn it is keeps it.
    pub fn join(&mut self, member: M) {
        self.members.push(member);
    }

    /// Removes the first member `which` picks; the others keep their turns.
    pub fn leave(&mut self, which: impl Fn(&M) -> bool) -> Option<M> {
        let at = self.members.iter().position(which)?;
        let member = self.members.remove(at);
        if at < self.next {
            self.next -= 1;
        }
        if self.next >= self.members.len() {
            self.next = 0;
        }
        Some(member)
    }

    /// The member a message goes to: from the one whose turn it is, the first `ready` says
    /// can take it now; else the one whose turn it is. Either way the turn passes to the one
    /// after it. `None` only when there are no members.
    pub fn choose(&mut self, mut ready: impl FnMut(&M) -> bool) -> Option<Choice> {
        let n = self.members.len();
        if n == 0 {
            return None;
        }
        let start = self.next % n;
        let found = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| ready(&self.members[i]));
        let (choice, at) = match found {
            Some(i) => (Choice::Ready(i), i),
            None => (Choice::Behind(start), start),
        };
        self.next = (at + 1) % n;
        Some(choice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picks(r: &mut Rotation<u32>, ready: impl Fn(u32) -> bool, n: usize) -> Vec<Choice> {
        (0..n).map(|_| r.choose(|&m| ready(m)).unwrap()).collect()
    }

    fn rotation(members: &[u32]) -> Rotation<u32> {
        let mut r = Rotation::default();
        members.iter().for_each(|&m| r.join(m));
        r
    }

    #[test]
    fn members_take_turns_and_each_message_goes_to_one() {
        let mut r = rotation(&[10, 11, 12]);
        let got: Vec<u32> = (0..7)
            .map(|_| match r.choose(|_| true).unwrap() {
                Choice::Ready(i) => r.members()[i],
                Choice::Behind(_) => unreachable!("all are ready"),
            })
            .collect();
        assert_eq!(got, [10, 11, 12, 10, 11, 12, 10]);
        assert_eq!(Rotation::<u32>::default().choose(|_| true), None);
    }

    #[test]
    fn a_member_that_cannot_take_it_now_is_passed_over() {
        let mut r = rotation(&[0, 1, 2]);
        // Member 1 is full: 0 and 2 share the messages, in turn.
        assert_eq!(
            picks(&mut r, |m| m != 1, 4),
            [
                Choice::Ready(0),
                Choice::Ready(2),
                Choice::Ready(0),
                Choice::Ready(2)
            ]
        );
        // Nobody can: the member whose turn it is, and the turn moves on.
        assert_eq!(
            picks(&mut r, |_| false, 4),
            [
                Choice::Behind(0),
                Choice::Behind(1),
                Choice::Behind(2),
                Choice::Behind(0)
            ]
        );
    }

    #[test]
    fn joining_and_leaving_keep_the_turns_fair() {
        let mut r = rotation(&[0, 1, 2]);
        assert_eq!(r.choose(|_| true), Some(Choice::Ready(0)));
        assert_eq!(r.choose(|_| true), Some(Choice::Ready(1)));
        // 2's turn: 0 leaving does not make 2 skip it.
        assert_eq!(r.leave(|&m| m == 0), Some(0));
        assert_eq!(r.choose(|_| true).map(|c| r.members()[ix(c)]), Some(2));
        r.join(3);
        let next: Vec<u32> = (0..3)
            .map(|_| {
                let c = r.choose(|_| true).unwrap();
                r.members()[ix(c)]
            })
            .collect();
        assert_eq!(next, [1, 2, 3]);
        assert_eq!(r.leave(|&m| m == 9), None);
        while !r.is_empty() {
            r.leave(|_| true);
        }
        assert_eq!(r.choose(|_| true), None);
    }

    fn ix(c: Choice) -> usize {
        match c {
            Choice::Ready(i) | Choice::Behind(i) => i,
        }
    }
}
