//! When a peer is lost: the loss of its last actor session, not of any.
//!
//! Two nodes may hold more than one ractor_cluster session at once: both
//! dial each other, a node reconnects before its old session has timed out,
//! and the session election stops the losers. Each of those teardowns is a
//! `node_session_disconnected` event; only the one that leaves a peer with
//! no session means the peer is gone. A transport counts its sessions from
//! its start (`Transport::on_peer_lost`): a count that began later would
//! take a session opened before it for the last one.

use std::collections::HashMap;

/// Live sessions per peer name.
#[derive(Debug, Default)]
pub struct Sessions(HashMap<String, usize>);

impl Sessions {
    /// A session with `peer` opened.
    pub fn opened(&mut self, peer: &str) {
        *self.0.entry(peer.to_string()).or_default() += 1;
    }

    /// A session with `peer` ended; true if it was the last one (or one
    /// opened before anyone counted, which is taken as the last).
    ///
    /// ```
    /// let mut sessions = streambatch_net::Sessions::default();
    /// sessions.opened("worker-1");
    /// sessions.opened("worker-1"); // a duplicate, soon an election loser
    /// assert!(!sessions.closed("worker-1"));
    /// assert!(sessions.closed("worker-1"));
    /// ```
    pub fn closed(&mut self, peer: &str) -> bool {
        match self.0.get_mut(peer) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => {
                self.0.remove(peer);
                true
            }
        }
    }
}
