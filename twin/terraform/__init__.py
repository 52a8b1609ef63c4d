"""infra/terraform applied to the twin's moto, as Terraform would apply it to AWS.

`expressions` and `functions` evaluate the Terraform language the .tf files use, on python-hcl2's parse trees;
`apply` walks the configuration and makes each block once; `data` reads the data sources, `resources` turns each
resource type into moto calls, `launch` makes the launch templates, the Lambdas and their schedules.
"""
