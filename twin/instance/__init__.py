"""One instance of the EC2 twin: what boots it and what it finds inside.

`cloud_config` reads a ``#cloud-config`` document into a plan, `guest` carries the plan out inside the
instance, `network` owns the bridge and the instances' network namespaces and `firewall` their security groups,
`imds` serves each instance's metadata inside its namespace, `sshd` its SSH server, `shims`, `standins` and
`debian` the commands and packages it finds, `bake` and `images` a baked node image; `sandbox.InstanceSandbox`
puts them together for one instance.
"""
