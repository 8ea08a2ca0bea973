"""Failing WireGuard handshakes: peers that reach us but never establish a session.

Owns one judgement, from what the device reports per peer (last handshake, bytes received):
a peer is *failing* when it has had no valid handshake while bytes kept arriving from it for
at least ``grace`` seconds. Without a session every byte a peer sends is a handshake
message, and WireGuard completes a handshake within one round trip when both sides agree on
the keys and the PSK; so a peer that sends but never completes has another PSK, or does not
have our public key. A peer that sends nothing (down, unreachable, idle) is never called
failing: that is no configuration error, and it must not make every node unready.

API: ``HandshakeWatch(grace).observe(peers, now) -> {public_key: seconds failing}``.
Must not touch: the device (it only reads what it is given). Never sees a key but public ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from flannel.wireguard.peers import HANDSHAKE_VALID
from flannel.wireguard.uapi import PeerState

#: Longer than REKEY_TIMEOUT (5 s): an initiator retries once in that time, and a matching
#: peer completes in one round trip.
FAIL_AFTER = 7.0


class HandshakeWatch:
    def __init__(self, grace: float = FAIL_AFTER) -> None:
        self.grace = grace
        self._rx_base: dict[str, int] = {}  # bytes received at the last valid handshake
        self._failing_since: dict[str, float] = {}

    def observe(self, peers: Mapping[str, PeerState], now: float) -> dict[str, float]:
        """The peers failing now, with how long; call on every reading of the device."""
        for gone in set(self._rx_base) - set(peers):
            self._rx_base.pop(gone, None)
            self._failing_since.pop(gone, None)
        failing: dict[str, float] = {}
        for key, state in peers.items():
            valid = (state.last_handshake is not None
                     and now - state.last_handshake < HANDSHAKE_VALID)
            if valid or key not in self._rx_base:
                self._rx_base[key] = state.rx_bytes
                self._failing_since.pop(key, None)
                continue
            if state.rx_bytes < self._rx_base[key]:  # the peer was re-added: counters restart
                self._rx_base[key] = state.rx_bytes
            elif state.rx_bytes > self._rx_base[key]:
                since = self._failing_since.setdefault(key, now)
                if now - since >= self.grace:
                    failing[key] = now - since
        return failing
