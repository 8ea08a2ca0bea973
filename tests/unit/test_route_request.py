"""Route requests: the protocol and scope a caller chooses reach the rtmsg header, the
defaults stay flannel's own, and a delete always matches any protocol and scope."""

from __future__ import annotations

import struct

from flannel.kernel import rtnl

ROUTE = rtnl.Route("10.5.0.0/16", None, 7)
REPLACE = rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK | rtnl.NLM_F_CREATE | rtnl.NLM_F_REPLACE


def header(message: bytes) -> tuple[int, ...]:
    """(family, dst_len, table, protocol, scope, type) of a route message."""
    family, dst_len, _src, _tos, table, protocol, scope, kind, _flags = \
        struct.unpack_from("=BBBBBBBBI", message, 16)
    return family, dst_len, table, protocol, scope, kind


def test_default_is_flannel_protocol_and_link_scope_without_gateway():
    message = rtnl.encode_route(ROUTE, rtnl.RTM_NEWROUTE, REPLACE, 1)
    assert header(message) == (2, 16, 254, rtnl.RTPROT_FLANNEL, rtnl.RT_SCOPE_LINK, 1)


def test_chosen_protocol_and_scope_are_sent():
    message = rtnl.encode_route(ROUTE, rtnl.RTM_NEWROUTE, REPLACE, 1,
                                protocol=rtnl.RTPROT_STATIC, scope=rtnl.RT_SCOPE_UNIVERSE)
    assert header(message) == (2, 16, 254, rtnl.RTPROT_STATIC, rtnl.RT_SCOPE_UNIVERSE, 1)
    decoded = rtnl.decode_route(message[16:])
    assert decoded == (ROUTE, rtnl.RTPROT_STATIC, 254)


def test_delete_matches_any_protocol_and_scope_whatever_is_asked():
    message = rtnl.encode_route(ROUTE, rtnl.RTM_DELROUTE, rtnl.NLM_F_REQUEST, 1,
                                protocol=rtnl.RTPROT_BOOT, scope=rtnl.RT_SCOPE_LINK)
    assert header(message)[3:5] == (rtnl.RTPROT_UNSPEC, rtnl.RT_SCOPE_NOWHERE)
