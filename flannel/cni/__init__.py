"""The flannel CNI plugin and its installer. Keep this package's import path light."""
