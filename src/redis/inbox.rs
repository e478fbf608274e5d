//! What the events channel brings a worker: transitions applied from the
//! state they carry, breakers to read back, keys opened elsewhere to
//! discover.

use ::redis::Msg;
use tokio::time::Instant;

use super::super::conn::{Conn, Failure};
use super::super::messages::{parse, Message};
use super::super::script::{self, Caller, Keys, Reply, Request, Rule};
use super::super::tracked::{Pending, Tracked};
use super::{Target, Worker};
use crate::breaker::SharedRules;

impl Worker {
    pub(super) async fn on_message(&mut self, conn: &mut Conn, msg: &Msg) -> Result<(), Failure> {
        // Anything not ours is ignored, but a message of another schema is
        // reported.
        let Ok(text) = std::str::from_utf8(msg.get_payload_bytes()) else {
            return Ok(());
        };
        let (name, epoch, closed) = match parse(text) {
            Message::Ignored => return Ok(()),
            Message::Other(schema) => {
                self.other_schema(schema);
                return Ok(());
            }
            Message::Spent { name } => {
                // Another replica found the fleet's spend over the budget:
                // read it now. Nothing to discover for a key not in use here.
                if let Some(t) = self.tracked.get_mut(name)
                    && t.spend.is_some()
                    && !t.dirty
                {
                    t.dirty = true;
                    self.named.push(t.name.clone());
                }
                return Ok(());
            }
            Message::State { name, reply } => {
                // The state a transition led to, newer than the one known
                // here: applied as is, without a round trip.
                if let Some(t) = self.tracked.get_mut(name)
                    && !t.force
                    && t.view.is_some_and(|v| reply.epoch > v.epoch)
                {
                    let (dirty, local) = (t.dirty, t.breaker.state());
                    let pending = Pending {
                        name: t.name.clone(),
                        request: Request::default(),
                        local,
                    };
                    let flush = self.settings.flush;
                    t.apply(reply, pending, Instant::now(), flush, &self.origins);
                    // A read already due for another reason still happens.
                    t.dirty = dirty;
                    self.busy.set(t, true);
                    return Ok(());
                }
                (name, reply.epoch, reply.cluster.is_closed())
            }
            Message::Named {
                name,
                epoch,
                closed,
            } => (name, epoch, closed),
        };
        if let Some(t) = self.tracked.get_mut(name) {
            if t.view.is_none_or(|v| v.epoch != epoch) && !t.dirty {
                t.dirty = true;
                self.named.push(t.name.clone());
            }
            return Ok(());
        }
        if closed {
            return Ok(());
        }
        self.discover(conn, name).await
    }

    /// A key this replica has not seen opened elsewhere: read its state, and
    /// only if Redis really holds it open, create the key's breaker here.
    async fn discover(&mut self, conn: &mut Conn, name: &str) -> Result<(), Failure> {
        let Target::Keyed(set) = &self.target else {
            return Ok(());
        };
        let keys = Keys::new(&self.settings.prefix, name);
        let rule = Rule::new(&SharedRules::default(), self.settings.window);
        let caller = Caller {
            channel: &self.channel,
            replica: &self.replica,
            quorum: self.quorum,
        };
        let inv = script::invocation(&caller, name, &keys, &rule, 0.0, &Request::default());
        let sent = Instant::now();
        let values = conn
            .invoke(std::slice::from_ref(&inv), self.settings.timeout)
            .await?;
        let reply = values
            .first()
            .and_then(Reply::parse)
            .ok_or(Failure::Reply)?;
        if reply.cluster.is_closed() {
            return Ok(());
        }
        let breaker = set.get_or_insert(name);
        // A full set hands out its overflow breaker, which must not be opened
        // for one key; told by identity, as a key may bear its name.
        if set.is_overflow(&breaker) || breaker.name() != Some(name) {
            return Ok(());
        }
        let mut t = Tracked::new(breaker, name.into(), &self.settings);
        t.breaker
            .remote()
            .set_turns(Some(self.desk.hook(&t.name, &t.keys.health)));
        t.seen = self.round;
        t.force = true;
        let local = t.breaker.state();
        t.apply(
            reply,
            Pending {
                name: t.name.clone(),
                request: Request::default(),
                local,
            },
            sent,
            self.settings.flush,
            &self.origins,
        );
        t.breaker.remote().set_shared(true);
        self.busy.set(&mut t, true);
        self.tracked.insert(t.name.clone(), t);
        Ok(())
    }
}
