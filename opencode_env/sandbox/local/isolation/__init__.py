"""How a local rollout is confined: bubblewrap compartments, host uids and id-mapped views, cgroups, the syscall
filter, the network namespace and its egress proxy, and the host programs a compartment sees."""
