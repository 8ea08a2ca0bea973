"""The files flanneld and its tools write and read: atomic writes with explicit modes,
bounded reads of regular files only, the helper processes' logs, and whether anyone but root
could change what a path leads to (``fileutil``). Below every layer; the CNI plugin's
installer uses it too."""
