"""The embedded local backend: bubblewrap namespaces, unprivileged host uids, cgroups, the egress proxy and
link-proof host-side file access."""
