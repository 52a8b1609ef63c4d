"""The EC2 twin: a stack of infra/terraform applied to a moto server, whose instances boot their user-data for
real on this machine, each in namespaces of its own (root only).

Its rooms: `twin.terraform` applies infra/terraform to moto (an evaluator of the expressions the .tf files use,
and the calls each resource becomes); `twin.instance` is one instance (its sandbox and the init inside it, its
network namespace and security groups, its metadata service, SSH server, the packages and commands it finds,
a baked image). At the top: the twin's AWS and its control (`stack`, `ec2twin`, `ssm`, `schedules`,
`account`), a deployment (`deploy`), the service (`serve`) and the day the tests run on it (`day`).
"""
