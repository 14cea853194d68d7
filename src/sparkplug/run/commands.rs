//! What arrives on the edge node's subscriptions: NCMD (only a rebirth is honoured),
//! DCMD (only a device's rebirth is honoured: fieldgate never writes to devices from the
//! broker) and the primary host's STATE; and what the node does when one is too large to take.

use super::*;

impl Node {
    pub(super) fn on_message(&mut self, topic: &str, payload: &[u8]) {
        match self.edge.topics().parse(topic) {
            Topic::State { host } if host == self.cfg.primary_host_id => self.on_state(payload),
            Topic::OwnBirth => self.echo_received(payload, false),
            Topic::NodeCommand => match Payload::decode_bytes(payload) {
                Ok(p) if asks_rebirth(&p) => {
                    if self.phase == Phase::Online {
                        // At most one a second: a flood of them is one rebirth a second.
                        if self.online_at.elapsed() >= REBIRTH_EVERY {
                            self.rebirth();
                        } else {
                            self.rebirth_pending = true;
                        }
                    }
                }
                Ok(p) => {
                    Counters::add(&self.counters.commands_refused, 1);
                    if let Some(skipped) = self.throttle.allow("ncmd") {
                        let metrics = p.metrics.len();
                        tracing::warn!(
                            metrics,
                            skipped,
                            "sparkplug: NCMD refused (only Node Control/Rebirth is honoured)"
                        );
                    }
                }
                Err(error) => {
                    Counters::add(&self.counters.commands_refused, 1);
                    if let Some(skipped) = self.throttle.allow("ncmd") {
                        tracing::warn!(%error, skipped, "sparkplug: NCMD refused: not a Sparkplug payload");
                    }
                }
            },
            Topic::DeviceCommand { device } => {
                let at = self.edge.registry().devices().iter().position(|d| d.id.as_str() == device);
                if let Some(d) = at
                    && Payload::decode_bytes(payload).is_ok_and(|p| asks_device_rebirth(&p))
                {
                    self.device_rebirth(d);
                    return;
                }
                Counters::add(&self.counters.commands_refused, 1);
                if let Some(skipped) = self.throttle.allow("dcmd") {
                    let device: String = device.chars().take(64).collect();
                    tracing::warn!(%device, skipped, "sparkplug: DCMD refused: fieldgate never writes to devices from the broker");
                }
            }
            _ => {}
        }
    }

    /// A device's rebirth asked by DCMD (`Device Control/Rebirth`): its DBIRTH again, when
    /// the node is online and the device born; at most once a second per device (a flood of
    /// them is one birth: the one just sent is current).
    fn device_rebirth(&mut self, device: usize) {
        if self.phase != Phase::Online || !self.edge.is_born(device) {
            return;
        }
        if self.device_rebirths.len() <= device {
            self.device_rebirths.resize(device + 1, None);
        }
        if self.device_rebirths[device].is_some_and(|t| t.elapsed() < REBIRTH_EVERY) {
            return;
        }
        self.device_rebirths[device] = Some(Instant::now());
        if let Some(skipped) = self.throttle.allow("device rebirth") {
            let id = self.edge.registry().devices()[device].id.to_string();
            tracing::info!(device = %id, skipped, "sparkplug: device rebirth asked (DCMD)");
        }
        Counters::add(&self.counters.rebirths, 1);
        self.dbirth(device);
    }

    /// A rebirth asked by NCMD: NBIRTH and every DBIRTH again (logged once a minute).
    pub(super) fn rebirth(&mut self) {
        self.rebirth_pending = false;
        if self.phase != Phase::Online {
            return;
        }
        if let Some(skipped) = self.throttle.allow("rebirth") {
            tracing::info!(skipped, "sparkplug: rebirth asked (NCMD)");
        }
        Counters::add(&self.counters.rebirths, 1);
        self.birth();
    }

    /// The primary host's STATE (Sparkplug 3.0: JSON `{"online": bool, "timestamp": ms}`).
    fn on_state(&mut self, payload: &[u8]) {
        #[derive(serde::Deserialize)]
        struct State {
            online: bool,
            timestamp: u64,
        }
        let s: State = match serde_json::from_slice(payload) {
            Ok(s) => s,
            Err(error) => {
                if let Some(skipped) = self.throttle.allow("state") {
                    tracing::warn!(%error, skipped, "sparkplug: the primary host's STATE is not {{\"online\":bool,\"timestamp\":ms}}; ignored");
                }
                return;
            }
        };
        // A STATE taken: whatever dropped connections before came elsewhere, or is gone.
        self.oversized.state = 0;
        self.oversized.hold_until = None;
        if s.timestamp < self.host_ts {
            return;
        }
        self.host_ts = s.timestamp;
        match (s.online, self.phase) {
            (true, Phase::AwaitingHost) => self.birth(),
            (false, Phase::Online) => self.leave(),
            // Offline here while another server may have it online: on to the next one
            // (nothing was born here, so there is nothing to declare dead).
            (false, Phase::AwaitingHost) if self.brokers.len() > 1 => self.pass(),
            _ => {}
        }
    }

    /// The primary host is offline on this server before the node was born: disconnect
    /// and try the next server (after the usual backoff, so all offline is no tight loop).
    fn pass(&mut self) {
        if let Some(skipped) = self.throttle.allow("host offline here") {
            tracing::warn!(
                broker = %self.counters.broker(),
                skipped,
                "sparkplug: the primary host is offline on this broker; trying the next"
            );
        }
        if let Some(l) = &self.link {
            let _ = l.client.try_disconnect();
        }
        self.phase = Phase::Leaving;
    }

    /// The primary host went offline: NDEATH, disconnect, and on to the next broker.
    fn leave(&mut self) {
        tracing::warn!("sparkplug: the primary host is offline: NDEATH, and on to the next broker");
        let death = self.edge.ndeath(self.bd_seq);
        if let Some(l) = &self.link {
            let _ = l.client.try_publish(death.topic, QoS::AtLeastOnce, false, death.payload);
            let _ = l.client.try_disconnect();
        }
        self.counters.online.store(false, Ordering::Relaxed);
        self.edge.all_dead();
        self.phase = Phase::Leaving;
    }

    /// A message larger than the node takes (1 MiB) arrived and the client dropped the
    /// connection: most likely one retained on a command topic, which every new connection
    /// would receive again. The next connections leave NCMD/DCMD out for `mqtt.commands_pause_s` (no
    /// rebirth on request meanwhile) so births and data go on; the warning names the topics
    /// and the remedy. Without command subscriptions it can only have come on STATE.
    pub(super) fn oversized(&mut self, size: usize) {
        let [ncmd, dcmd] = self.edge.topics().command_filters();
        let key = if self.commands_subscribed { "oversized on commands" } else { "oversized on STATE" };
        if let Some(skipped) = self.throttle.allow(key) {
            if self.commands_subscribed {
                // With a primary host the STATE topic was subscribed too: it may have come there.
                let state =
                    (!self.cfg.primary_host_id.is_empty()).then(|| topic::state(&self.cfg.primary_host_id));
                tracing::warn!(
                    size,
                    limit = link::MAX_INCOMING,
                    ncmd,
                    dcmd,
                    state = state.unwrap_or_default(),
                    skipped,
                    "sparkplug: a message too large to take arrived on the node's subscriptions (likely retained on one of these topics) and dropped the connection; commands are not subscribed for mqtt.commands_pause_s (600 s by default) so data keeps flowing (if the warning comes again, it is on STATE). Remove it by publishing an empty retained message on that topic, and allow only the host application to publish NCMD/DCMD/STATE (broker ACLs)"
                );
            } else {
                let state = topic::state(&self.cfg.primary_host_id);
                tracing::warn!(
                    size,
                    limit = link::MAX_INCOMING,
                    state,
                    skipped,
                    "sparkplug: a message too large to take arrived on the primary host's STATE topic and dropped the connection. Remove it by publishing an empty retained message there, and allow only the host application to publish it (broker ACLs)"
                );
            }
        }
        let base = Duration::from_secs(self.cfg.commands_pause_s);
        if self.commands_subscribed {
            // Again right after the pause: the message is still there; each time, twice as long.
            if self.oversized.commands_back_at.is_some_and(|t| t.elapsed() >= base) {
                self.oversized.commands = 0;
            }
            let pause = doubled(base, self.oversized.commands);
            self.oversized.commands += 1;
            self.commands_off_until = Some(Instant::now() + pause);
        } else {
            // On STATE, which the node cannot do without: no new connection for a pause
            // (doubling), rather than one a backoff step later that takes it again.
            let hold = doubled(base, self.oversized.state);
            self.oversized.state += 1;
            self.oversized.hold_until = Some(Instant::now() + hold);
            tracing::error!(
                state = topic::state(&self.cfg.primary_host_id),
                wait_s = hold.as_secs(),
                "sparkplug: the primary host's STATE holds a message too large to take; not connecting again before the wait is over"
            );
        }
    }

    /// Once the pause after an oversized command is over, subscribes to the command topics
    /// again on the connection there is (a stable link may never reconnect by itself).
    pub(super) fn commands_back(&mut self) {
        let over = self.commands_off_until.is_some_and(|t| t <= Instant::now()) && self.oversized.state == 0;
        let Some(l) =
            self.link.as_ref().filter(|_| over && !self.commands_subscribed && self.connected_at.is_some())
        else {
            return;
        };
        self.commands_off_until = None;
        self.commands_subscribed = true;
        self.oversized.commands_back_at = Some(Instant::now());
        for f in self.edge.topics().command_filters() {
            if let Err(error) = l.client.try_subscribe(f, QoS::AtLeastOnce) {
                tracing::warn!(%error, "sparkplug: cannot subscribe");
            }
        }
        tracing::info!("sparkplug: commands subscribed again after the pause");
    }
}

/// `base` doubled `times` times, at most a day.
fn doubled(base: Duration, times: u32) -> Duration {
    base.saturating_mul(1u32 << times.min(16)).min(Duration::from_secs(86_400))
}
