"""The twin's account limits: what an AWS account says of its quotas, which moto does not say by itself.

`gridfleet aws preflight` asks them, and the apply of a stack may meet them:
- EC2's vCPU quotas in Service Quotas (moto knows only VPC's): the account's applied values of All Standard
  Spot Instance Requests (`L-34B43A08`) and Running On-Demand Standard instances (`L-1216C47A`), in vCPUs;
- Lambda's GetAccountSettings (moto has no such call): the account's concurrency and what the functions left
  unreserved;
- Lambda's rule that a reservation may not leave fewer than 100 unreserved executions (moto enforces it when
  told the account's concurrency, `MOTO_LAMBDA_CONCURRENCY_QUOTA`), so an account with a low quota refuses a
  reserved concurrency as AWS does;
- the name IAM gives the Spot service-linked role (`AWSServiceRoleForEC2Spot`; moto would call it
  `AWSServiceRoleForspot`).

It also publishes what AWS publishes in every account and moto does not: the SSM parameters of Debian 12's AMIs
(`/aws/service/debian/release/12/latest/amd64` and `/arm64`, `publish_debian_images`), which the stack and the
preflight resolve.

`install(limits)` puts these answers on moto's classes once (they hold for every account and region of this
process, which the twin is the only user of); `limits` stays the twin's to change (`TwinStack.limits`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

SPOT_VCPUS = "L-34B43A08"
ON_DEMAND_VCPUS = "L-1216C47A"
_QUOTA_NAMES = {SPOT_VCPUS: "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests",
                ON_DEMAND_VCPUS: "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"}  # fmt: skip
#: IAM's names of service-linked roles moto names otherwise, by service principal.
_LINKED_ROLES = {"spot.amazonaws.com": "AWSServiceRoleForEC2Spot"}


@dataclass
class AccountLimits:
    """The twin's account: its EC2 vCPU quotas and its Lambda concurrency (an established account's values)."""

    spot_vcpus: int = 256
    on_demand_vcpus: int = 256
    lambda_concurrency: int = 1000

    def quota(self, code: str) -> int | None:
        return {SPOT_VCPUS: self.spot_vcpus, ON_DEMAND_VCPUS: self.on_demand_vcpus}.get(code)


_limits = AccountLimits()


def install(limits: AccountLimits) -> None:
    """moto answers with `limits` from now on (see the module docstring); the last call's limits hold."""
    global _limits
    _limits = limits
    os.environ["MOTO_LAMBDA_CONCURRENCY_QUOTA"] = str(limits.lambda_concurrency)
    _quotas()
    _account_settings()
    _linked_roles()


def _quotas() -> None:
    from moto.servicequotas.models import ServiceQuotasBackend

    if getattr(ServiceQuotasBackend.get_service_quota, "_twin", False):
        return
    moto_own = ServiceQuotasBackend.get_service_quota

    def get_service_quota(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        value = _limits.quota(quota_code) if service_code == "ec2" else None
        if value is None:
            return dict(moto_own(self, service_code, quota_code))
        arn = f"arn:aws:servicequotas:{self.region_name}:{self.account_id}:ec2/{quota_code}"
        return {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)", "QuotaArn": arn,
                "QuotaCode": quota_code, "QuotaName": _QUOTA_NAMES[quota_code], "Value": float(value),
                "Unit": "None", "Adjustable": True, "GlobalQuota": False}  # fmt: skip

    get_service_quota._twin = True  # type: ignore[attr-defined]
    ServiceQuotasBackend.get_service_quota = get_service_quota  # type: ignore[method-assign]


def _account_settings() -> None:
    from moto.awslambda import urls
    from moto.awslambda.models import lambda_backends
    from moto.awslambda.responses import LambdaResponse

    if hasattr(LambdaResponse, "get_account_settings"):
        return

    def get_account_settings(self: Any) -> str:
        backend = lambda_backends[self.current_account][self.region]
        reserved = sum(int(f.reserved_concurrency or 0) for f in backend.list_functions())
        limit = {"ConcurrentExecutions": _limits.lambda_concurrency,
                 "UnreservedConcurrentExecutions": _limits.lambda_concurrency - reserved,
                 "TotalCodeSize": 80530636800, "CodeSizeUnzipped": 262144000, "CodeSizeZipped": 52428800}  # fmt: skip
        usage = {"TotalCodeSize": 0, "FunctionCount": len(list(backend.list_functions()))}
        return json.dumps({"AccountLimit": limit, "AccountUsage": usage})

    LambdaResponse.get_account_settings = get_account_settings  # type: ignore[attr-defined]
    # GET /2016-08-19/account-settings/, before moto's server makes its Lambda routes (at the first Lambda call)
    urls.url_paths[r"{0}/(?P<api_version>[^/]+)/account-settings/?$"] = LambdaResponse.dispatch


def _linked_roles() -> None:
    from moto.iam.models import IAMBackend

    if getattr(IAMBackend.create_service_linked_role, "_twin", False):
        return
    moto_own = IAMBackend.create_service_linked_role

    def create_service_linked_role(self: Any, service_name: str, description: str, suffix: str) -> Any:
        name = _LINKED_ROLES.get(service_name)
        if name is None:
            return moto_own(self, service_name, description, suffix)
        policy = {"Version": "2012-10-17", "Statement": [
            {"Action": ["sts:AssumeRole"], "Effect": "Allow", "Principal": {"Service": [service_name]}}]}  # fmt: skip
        path = f"/aws-service-role/{service_name}/"
        return self.create_role(name, json.dumps(policy), path, permissions_boundary=None, description=description,
                                tags=[], max_session_duration="3600", linked_service=service_name)  # fmt: skip

    create_service_linked_role._twin = True  # type: ignore[attr-defined]
    IAMBackend.create_service_linked_role = create_service_linked_role  # type: ignore[method-assign]


DEBIAN_PARAMETER = "/aws/service/debian/release/12/latest/{arch}"  # AWS's public parameters of Debian 12's AMIs


def publish_debian_images(ec2: Any, account: str, region: str) -> dict[str, str]:
    """AWS's public parameters of Debian 12's AMIs in the twin's SSM, each naming one of moto's images of that
    architecture (an account cannot put a parameter under /aws/, so it goes into moto's store as AWS's own); the
    AMI id by parameter name."""
    import datetime

    from moto.ssm.models import Parameter, ssm_backends

    images = ec2.describe_images(Owners=["amazon"])["Images"]
    store = ssm_backends[account][region]._parameters
    made = {}
    for deb, arch in (("amd64", "x86_64"), ("arm64", "arm64")):
        ami = min(i["ImageId"] for i in images if i.get("Architecture") == arch)
        name = DEBIAN_PARAMETER.format(arch=deb)
        store[name] = [Parameter(account_id=account, name=name, value=ami, parameter_type="String", description=None,  # type: ignore[abstract]
                                 allowed_pattern=None, keyid=None, last_modified_date=datetime.datetime.now(),
                                 version=1, data_type="aws:ec2:image")]  # fmt: skip
        made[name] = ami
    return made
