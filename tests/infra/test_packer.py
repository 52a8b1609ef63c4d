"""infra/packer's node image template, evaluated: the base image and build instance its `arch` chooses, and the
tags by which a preflight check knows a baked node image and what it holds.

No `packer` binary is here. The template is HCL like the Terraform files, so the EC2 twin's evaluator
(`twin.terraform.expressions`) computes its expressions for given variables; the data source's value (the base
AMI id) and the build's timestamp are stand-ins. tests/unit/test_node_image.py checks the rest of the template
(encryption, IMDSv2, the bake's provisioners).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.config.aws import AwsConfig
from fleet.platform import instance_type_arch
from twin.terraform.expressions import Evaluator, Namespace, TfModule, Where

PACKER = Path(__file__).resolve().parents[2] / "infra" / "packer"
BASE_AMI = "ami-0123456789abcdef0"
#: Debian's architecture names, as EC2 names them.
EC2_ARCH = {"amd64": "x86_64", "arm64": "arm64"}


class Template:
    """node.pkr.hcl, evaluated for some variables over their defaults."""

    def __init__(self, **given: Any) -> None:
        self.module = TfModule(PACKER, "*.pkr.hcl")
        plain = Evaluator(self.module, {})
        self.var = {
            name: given[name] if name in given else plain.evaluate(body.attrs["default"], Where(body.file, name))
            for name, body in self.module.variables.items()
            if name in given or "default" in body.attrs
        }
        data = {"amazon-parameterstore": {"base": {"value": BASE_AMI}}}
        roots = {"var": self.var, "data": data, "local": Namespace("local", self.local), "path": {"root": str(PACKER)}}
        self.ev = Evaluator(self.module, roots)

    def local(self, name: str) -> Any:
        if name == "stamp":  # the build's timestamp is Packer's to give
            return "20261124-010000"
        file, tree = self.module.locals[name]
        return self.ev.evaluate(tree, Where(file, f"local.{name}"))

    def data(self, kind: str, name: str, attr: str) -> Any:
        body = self.module.data[(kind, name)]
        return self.ev.evaluate(body.attrs[attr], Where(body.file, f"data.{kind}.{name}"))

    def source(self, attr: str) -> Any:
        body = self.module.sources[("amazon-ebs", "node")]
        return self.ev.evaluate(body.attrs[attr], Where(body.file, "source.amazon-ebs.node"))

    def valid(self, variable: str) -> bool:
        """Whether the variable's validation blocks hold for its value."""
        body = self.module.variables[variable]
        checks = [b.attrs["condition"] for kind, _, b in body.blocks if kind == "validation"]
        assert checks, f"variable {variable} has no validation"
        return all(self.ev.evaluate(c, Where(body.file, f"variable {variable}")) for c in checks)


@pytest.mark.parametrize("arch", ["amd64", "arm64"])
def test_arch_chooses_debians_image_and_a_build_instance_of_that_architecture(arch):
    t = Template(bundle="dist/gridfleet-bundle.tar.gz", arch=arch)
    assert t.valid("arch")
    assert t.data("amazon-parameterstore", "base", "name") == f"/aws/service/debian/release/12/latest/{arch}"
    instance_type = t.source("instance_type")
    assert instance_type_arch(instance_type) == EC2_ARCH[arch], instance_type
    assert t.source("source_ami") == BASE_AMI


def test_the_default_is_the_stacks_own_debian_on_x86():
    """Without arch the image is built from the stack's own base (infra/terraform's ami_parameter default)."""
    from tests.infra.test_terraform import config as terraform

    t = Template(bundle="b.tar.gz")
    assert t.var["arch"] == "amd64"
    assert t.data("amazon-parameterstore", "base", "name") == terraform().default("ami_parameter")
    assert instance_type_arch(t.source("instance_type")) == "x86_64"


def test_a_given_base_parameter_and_instance_type_win():
    t = Template(bundle="b.tar.gz", arch="arm64", ami_parameter="/gridfleet/base-arm", instance_type="c7g.large")
    assert t.data("amazon-parameterstore", "base", "name") == "/gridfleet/base-arm"
    assert t.source("instance_type") == "c7g.large"


@pytest.mark.parametrize("arch", ["x86_64", "aarch64", "AMD64", ""])
def test_an_arch_debian_does_not_name_so_is_refused(arch):
    assert not Template(bundle="b.tar.gz", arch=arch).valid("arch")


def test_the_image_is_tagged_as_a_node_image_with_what_it_holds():
    tags = Template(bundle="dist/gridfleet-bundle.tar.gz").source("tags")
    assert tags["gridfleet:image"] == "node"
    assert tags["gridfleet:baked"].split(" ") == ["amazon-ssm-agent", "amazon-efs-utils"]
    assert tags["gridfleet:python"] == AwsConfig().image_python == "3.11"  # Debian 12's, the bundle's default
    assert tags["gridfleet:bundle"] == "gridfleet-bundle.tar.gz"
    assert tags["gridfleet:base"] == BASE_AMI


def test_what_the_tags_say_is_baked_is_what_the_bake_installs():
    from cloud_init import render_bake

    bake = render_bake()
    for package in Template(bundle="b.tar.gz").source("tags")["gridfleet:baked"].split():
        assert f"install_{package.removeprefix('amazon-').replace('-', '_')}" in bake, package


def test_the_bake_is_told_the_region_its_agent_package_comes_from():
    module = TfModule(PACKER, "*.pkr.hcl")
    assert "GRIDFLEET_REGION=${var.region}" in module.texts["node.pkr.hcl"]
