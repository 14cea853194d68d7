//! Whether the broker takes this node's messages. A broker drops a publish its ACL forbids
//! without a word to the client (MQTT 3.1.1 has no way to say so; Mosquitto even
//! acknowledges one at QoS 1), so a node whose topics are not allowed would believe it
//! sends while every value is lost. On each connection the node therefore subscribes to its
//! own NBIRTH topic (before anything else), and after its NBIRTH sends no data until the
//! broker delivers that very NBIRTH back (the same bytes, its millisecond timestamp
//! included, and not retained: another client's NBIRTH guessing the `bdSeq` does not
//! count). If it does not come
//! within `mqtt.confirm_birth_s`, the connection is dropped and tried again after the
//! backoff (on the next broker, if several), the data waits in the buffer, and
//! `get_device_status` says why. The node's ACL must therefore let it read its own NBIRTH
//! topic too: a broker that refuses that subscription (a SUBACK failure, as some brokers
//! answer) turns the check off for the connection, but Mosquitto grants it and then drops
//! the delivery, which looks the same as a dropped NBIRTH. Either way nothing is lost; the
//! message says both causes, and `confirm_birth_s = 0` turns the check off.

use rumqttc::SubscribeReasonCode;

use super::*;

/// The check on the current connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Echo {
    /// Not checked (turned off, or the broker refused the subscription).
    Off,
    /// Subscribed (`pkid` once written), NBIRTH not sent yet.
    Subscribed { pkid: Option<u16> },
    /// NBIRTH sent (`sent`, its bytes): data waits until it comes back, or until `until`.
    Waiting { pkid: Option<u16>, until: Instant, sent: Vec<u8> },
    /// It came back: the broker takes this node's messages.
    Confirmed,
}

/// What `get_device_status` and the log say when the NBIRTH does not come back.
const DROPPED: &str = "the broker did not deliver this node's NBIRTH back: its ACL does not let the node publish its topics, or read its own NBIRTH topic (allow both, or set mqtt.confirm_birth_s = 0); data waits in the buffer";

impl Node {
    /// On a new connection, first of all: the subscription to the node's own NBIRTH.
    pub(super) fn echo_subscribe(&mut self) {
        self.echo = Echo::Off;
        let Some(l) = &self.link else { return };
        if self.cfg.confirm_birth_s == 0 {
            return;
        }
        match l.client.try_subscribe(self.edge.topics().node(topic::Kind::NBirth), QoS::AtMostOnce) {
            Ok(()) => self.echo = Echo::Subscribed { pkid: None },
            Err(error) => tracing::warn!(%error, "sparkplug: cannot subscribe to the node's own NBIRTH"),
        }
    }

    /// Whether data waits for the NBIRTH to come back.
    pub(super) fn echo_pending(&self) -> bool {
        matches!(self.echo, Echo::Waiting { .. })
    }

    /// Whether births sent now are not yet known to reach the broker.
    pub(super) fn echo_unconfirmed(&self) -> bool {
        matches!(self.echo, Echo::Subscribed { .. } | Echo::Waiting { .. })
    }

    /// An NBIRTH (`payload`) was sent: the first on this connection starts the wait.
    pub(super) fn echo_birth_sent(&mut self, payload: &[u8]) {
        match &mut self.echo {
            Echo::Subscribed { pkid } => {
                let until = Instant::now() + Duration::from_secs(self.cfg.confirm_birth_s);
                self.echo = Echo::Waiting { pkid: *pkid, until, sent: payload.to_vec() };
            }
            // A rebirth meanwhile: its NBIRTH is the one to come back.
            Echo::Waiting { sent, .. } => *sent = payload.to_vec(),
            Echo::Off | Echo::Confirmed => self.births_taken(),
        }
    }

    /// The connection's first SUBSCRIBE written: its packet ID is the check's.
    pub(super) fn echo_subscribe_written(&mut self, id: u16) {
        if let Echo::Subscribed { pkid: p @ None } | Echo::Waiting { pkid: p @ None, .. } = &mut self.echo {
            *p = Some(id);
        }
    }

    /// A SUBACK: the check's refused means the node may not read its own topics.
    pub(super) fn echo_suback(&mut self, id: u16, codes: &[SubscribeReasonCode]) {
        let (Echo::Subscribed { pkid } | Echo::Waiting { pkid, .. }) = &self.echo else { return };
        let pkid = *pkid;
        if pkid != Some(id) || !matches!(codes.first(), Some(SubscribeReasonCode::Failure)) {
            return;
        }
        if let Some(skipped) = self.throttle.allow("echo") {
            tracing::warn!(
                skipped,
                "sparkplug: the broker does not let the node read its own NBIRTH topic, so whether it takes the node's messages cannot be checked; data is sent unchecked"
            );
        }
        let was_waiting = self.echo_pending();
        self.echo = Echo::Off;
        if was_waiting {
            self.births_taken();
        }
    }

    /// The node's own NBIRTH, delivered back (not retained): the very bytes this connection
    /// sent confirm. Another's NBIRTH on the node's topic (a client that may publish there
    /// guessing the next `bdSeq`, or a retained one) does not: it would have to match the
    /// payload's millisecond timestamp too.
    pub(super) fn echo_received(&mut self, payload: &[u8], retained: bool) {
        let Echo::Waiting { sent, .. } = &self.echo else { return };
        if !retained && sent.as_slice() == payload {
            self.echo = Echo::Confirmed;
            self.births_taken();
        }
    }

    /// Every tick: the wait over without the NBIRTH, the connection is given up.
    pub(super) fn echo_due(&mut self) {
        let Echo::Waiting { until, .. } = &self.echo else { return };
        if Instant::now() < *until {
            return;
        }
        self.echo = Echo::Off;
        self.edge.births_dropped();
        *self.counters.link_error.lock() = Some(DROPPED.to_string());
        // Not a connection that worked: the backoff goes on growing, and the line is
        // logged as failed connections are (once a minute).
        self.connected_at = None;
        self.phase = Phase::Connecting;
        self.lost(DROPPED, true);
    }

    /// The births reached the broker: the link works.
    fn births_taken(&mut self) {
        self.edge.births_taken();
        *self.counters.link_error.lock() = None;
        self.counters.online.store(true, Ordering::Relaxed);
        self.drain_idle = false;
    }
}
