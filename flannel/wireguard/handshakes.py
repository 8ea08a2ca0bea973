"""Failing WireGuard handshakes: peers that reach us but never establish a session.

Owns one judgement, from what the device reports per peer (last handshake, bytes received):
a peer is *failing* when it has had no valid handshake while bytes kept arriving from it for
at least ``grace`` seconds, until it has sent nothing for ``quiet`` seconds. Without a
session every byte a peer sends is a handshake message, and WireGuard completes a handshake
within one round trip when both sides agree on the keys and the PSK; so a peer that sends
but never completes has another PSK, or does not have our public key. A peer that sends
nothing (down, unreachable, idle) is never called failing: that is no configuration error,
and it must not make every node unready.

API: ``HandshakeWatch(grace, quiet).observe(peers, now) -> {public_key: seconds failing}``.
Must not touch: the device (it only reads what it is given). Never sees a key but public ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from flannel.wireguard.peers import HANDSHAKE_VALID
from flannel.wireguard.uapi import PeerState

#: Longer than REKEY_TIMEOUT (5 s): an initiator retries once in that time, and a matching
#: peer completes in one round trip.
FAIL_AFTER = 7.0
#: REKEY_ATTEMPT_TIME (90 s) and a margin: how long an initiator keeps retrying. A peer heard
#: from no longer than this is no longer failing (a PSK fixed while no traffic flows).
QUIET_AFTER = 95.0


class _Peer:
    def __init__(self, rx: int) -> None:
        self.rx = rx
        self.failing_since: float | None = None
        self.last_growth = 0.0


class HandshakeWatch:
    def __init__(self, grace: float = FAIL_AFTER, quiet: float = QUIET_AFTER) -> None:
        self.grace = grace
        self.quiet = quiet
        self._peers: dict[str, _Peer] = {}

    def observe(self, peers: Mapping[str, PeerState], now: float) -> dict[str, float]:
        """The peers failing now, with how long; call on every reading of the device."""
        for gone in set(self._peers) - set(peers):
            del self._peers[gone]
        failing: dict[str, float] = {}
        for key, state in peers.items():
            seen = self._peers.get(key)
            valid = (state.last_handshake is not None
                     and now - state.last_handshake < HANDSHAKE_VALID)
            # New, in session, or re-added (its counters restart): nothing held against it.
            if seen is None or valid or state.rx_bytes < seen.rx:
                self._peers[key] = _Peer(state.rx_bytes)
                continue
            if state.rx_bytes > seen.rx:
                seen.rx, seen.last_growth = state.rx_bytes, now
                if seen.failing_since is None:
                    seen.failing_since = now
            if seen.failing_since is None:
                continue
            if now - seen.last_growth > self.quiet:
                seen.failing_since = None  # it stopped trying: the episode is over
            elif now - seen.failing_since >= self.grace:
                failing[key] = now - seen.failing_since
        return failing
