"""Decoding what flanneld does not control (the store, the network, files, flags): JSON within
size, depth and element bounds (``boundedjson``), Go ``encoding/json``'s behaviours that the
wire formats keep (``gojson``), IP addresses and their checks (``netutil``). Below every
layer; the CNI plugin's installer uses ``boundedjson`` too."""
