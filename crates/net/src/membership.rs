//! When a peer is lost: the loss of its last actor session, not of any.
//!
//! Two nodes may hold more than one ractor_cluster session at once: both
//! dial each other, a node reconnects before its old session has timed out,
//! and the session election stops the losers. Each of those teardowns is a
//! `node_session_disconnected` event; only the one that leaves a peer with
//! no session means the peer is gone.

use std::collections::HashMap;
use std::sync::Mutex;

use ractor_cluster::NodeEventSubscription;
use ractor_cluster::node::NodeServerSessionInformation;

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

/// A NodeServer subscription that calls `on_lost` with a peer's name when
/// its last session ends. The call runs inside the NodeServer: it must not
/// block (send a message).
pub struct OnPeerLost<F> {
    sessions: Mutex<Sessions>,
    on_lost: F,
}

impl<F: Fn(&str) + Send + Sync + 'static> OnPeerLost<F> {
    /// Calls `on_lost` for each peer whose last session ends.
    pub fn new(on_lost: F) -> Self {
        Self {
            sessions: Mutex::new(Sessions::default()),
            on_lost,
        }
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<F: Fn(&str) + Send + Sync + 'static> NodeEventSubscription for OnPeerLost<F> {
    fn node_session_opened(&self, session: NodeServerSessionInformation) {
        self.sessions().opened(&session.peer_addr);
    }

    fn node_session_disconnected(&self, session: NodeServerSessionInformation) {
        let last = self.sessions().closed(&session.peer_addr);
        if last {
            (self.on_lost)(&session.peer_addr);
        }
    }

    fn node_session_authenticated(&self, _: NodeServerSessionInformation) {}
}
