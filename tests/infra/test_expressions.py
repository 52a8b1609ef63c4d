"""infra/terraform's variable validations and computed locals, evaluated for chosen variables.

The EC2 twin's evaluator (`twin.terraform.expressions`) computes an expression of the .tf files with the variables
given over their defaults; data sources stand in as what AWS would answer (the partition, the account). No
endpoint is involved: what is checked here is the expression, for values a single applied stack would not
show, such as a variable's refused values or a parameter of the account's own beside AWS's public one.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.infra.conftest import TF_DIR
from twin.terraform.expressions import Evaluator, Namespace, TfModule, Where

ACCOUNT = "123456789012"
REGION = "eu-west-1"


class Stack:
    """The module's expressions, for some variables over their defaults."""

    def __init__(self, **given: Any) -> None:
        self.module = TfModule(TF_DIR)
        plain = Evaluator(self.module, {})
        self.var = {
            name: given[name] if name in given else plain.evaluate(body.attrs["default"], Where(body.file, name))
            for name, body in self.module.variables.items()
            if name in given or "default" in body.attrs
        }
        data = {
            "aws_caller_identity": {"current": {"account_id": ACCOUNT}},
            "aws_partition": {"current": {"partition": "aws"}},
        }
        self.ev = Evaluator(self.module, {"var": self.var, "data": data, "local": Namespace("local", self.local)})

    def local(self, name: str) -> Any:
        file, tree = self.module.locals[name]
        return self.ev.evaluate(tree, Where(file, f"local.{name}"))

    def valid(self, variable: str) -> bool:
        body = self.module.variables[variable]
        checks = [b.attrs["condition"] for kind, _, b in body.blocks if kind == "validation"]
        assert checks, f"variable {variable} has no validation"
        return all(self.ev.evaluate(c, Where(body.file, f"variable {variable}")) for c in checks)


@pytest.mark.parametrize(
    ("value", "valid"), [(None, True), (1, True), (5, True), (0, False), (-1, False), (1.5, False)]
)
def test_lambda_reserved_concurrency_is_unset_or_a_whole_number_of_executions(value, valid):
    assert Stack(lambda_reserved_concurrency=value).valid("lambda_reserved_concurrency") is valid


def test_lambda_reserved_concurrency_is_unset_by_default_and_documented_with_awss_rule():
    """AWS refuses a reservation that leaves fewer than 100 unreserved executions: where the variable is set,
    the reader is told so."""
    stack = Stack()
    assert stack.var["lambda_reserved_concurrency"] is None
    body = stack.module.variables["lambda_reserved_concurrency"]
    assert "100" in stack.ev.evaluate(body.attrs["description"], Where(body.file, "lambda_reserved_concurrency"))
    for doc in ("README.md", "terraform.tfvars.example"):
        text = (TF_DIR / doc).read_text()
        assert "lambda_reserved_concurrency" in text and "100 unreserved" in text, doc


PUBLIC = "/aws/service/debian/release/12/latest/amd64"


@pytest.mark.parametrize(
    ("ami", "node_ami", "arns"),
    [
        (PUBLIC, None, [f"arn:aws:ssm:{REGION}::parameter{PUBLIC}"]),
        (
            PUBLIC,
            "/gridfleet/node-ami",
            [
                f"arn:aws:ssm:{REGION}::parameter{PUBLIC}",
                f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/gridfleet/node-ami",
            ],
        ),
        (
            "/team/debian-12",
            "/aws/service/debian/release/12/latest/arm64",
            [
                f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/team/debian-12",
                f"arn:aws:ssm:{REGION}::parameter/aws/service/debian/release/12/latest/arm64",
            ],
        ),
    ],
)
def test_an_ami_parameters_arn_has_the_account_unless_aws_publishes_it(ami, node_ami, arns):
    stack = Stack(region=REGION, ami_parameter=ami, node_ami_parameter=node_ami)
    assert stack.local("ami_parameter_arns") == arns
