# The gridfleet node image: the Debian 12 AMI the stack uses, with what every
# node's boot script would otherwise install baked in (bake.sh: the Debian
# packages, the SSM agent, amazon-efs-utils, the crawl user, a venv with the
# bundle's pinned dependencies, the Selenium server jar, and the marker
# /opt/gridfleet/image.json). A node booted from it installs only gridfleet and
# the crawler project of its run's bundle; a bundle with other pinned
# dependencies than the image's gets a new venv, as on the stock image.
#
#   gridfleet bundle --config fleet.yaml --out dist
#   packer init infra/packer && packer build -var bundle=dist/gridfleet-bundle.tar.gz \
#     -var efs_utils_deb=amazon-efs-utils.deb infra/packer
#
# For Graviton nodes, add -var arch=arm64 (Debian's arm64 image, built on a
# Graviton instance) and give an arm64 bundle and .deb. Name the AMI it prints in
# infra/terraform's node_ami_parameter (an SSM parameter holding its id) or in
# fleet.yaml's aws.node_ami. Its tags say what it is (gridfleet:image = node)
# and holds (gridfleet:baked, gridfleet:python), for a preflight check to read.
# No credentials or other secrets are in here: Packer uses the operator's AWS
# credentials and a temporary SSH key of its own.

packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = ">= 1.3.0"
    }
  }
}

variable "region" {
  type        = string
  description = "Region of the stack (infra/terraform's region)."
  default     = "ap-northeast-2"
}

variable "arch" {
  type        = string
  description = "Debian's name of the nodes' architecture: amd64 (x86_64) or arm64 (Graviton). It chooses the base image and the instance the image is built on."
  default     = "amd64"

  validation {
    condition     = contains(["amd64", "arm64"], var.arch)
    error_message = "arch: amd64 or arm64."
  }
}

variable "ami_parameter" {
  type        = string
  description = "SSM parameter of the base AMI; empty: Debian 12's for arch, /aws/service/debian/release/12/latest/<arch> (for amd64, infra/terraform's ami_parameter)."
  default     = ""
}

variable "bundle" {
  type        = string
  description = "The code bundle of `gridfleet bundle` (dist/gridfleet-bundle.tar.gz): its pinned dependencies are baked."
}

variable "efs_utils_deb" {
  type        = string
  description = "amazon-efs-utils .deb of arch (Debian does not package it; see docs/aws/efs-utils.md); empty only when the base image has it."
  default     = ""
}

variable "crawl_user" {
  type        = string
  description = "fleet.crawl_user of the fleets that use the image."
  default     = "gridfleet"
}

variable "crawl_uid" {
  type        = number
  description = "fleet.crawl_uid (infra/terraform's crawl_uid): the crawl user's uid and gid."
  default     = 2000
}

variable "instance_type" {
  type        = string
  description = "Instance type the image is built on, of arch's architecture; empty: t3.medium for amd64, t4g.medium for arm64."
  default     = ""
}

variable "subnet_id" {
  type        = string
  description = "Subnet to build in; empty: the default VPC's. It needs a way out to the Debian mirrors."
  default     = ""
}

variable "kms_key_id" {
  type        = string
  description = "KMS key of the image's encrypted root volume; empty: the account's default EBS key."
  default     = ""
}

# Written out here rather than through a local: Packer evaluates data sources
# before locals.
data "amazon-parameterstore" "base" {
  name   = var.ami_parameter != "" ? var.ami_parameter : "/aws/service/debian/release/12/latest/${var.arch}"
  region = var.region
}

locals {
  stamp         = formatdate("YYYYMMDD-hhmmss", timestamp())
  work_dir      = "/tmp/gridfleet-bake"
  deb_arg       = var.efs_utils_deb == "" ? "" : "${local.work_dir}/${basename(var.efs_utils_deb)}"
  instance_type = var.instance_type != "" ? var.instance_type : lookup({ amd64 = "t3.medium", arm64 = "t4g.medium" }, var.arch)
}

source "amazon-ebs" "node" {
  region        = var.region
  source_ami    = data.amazon-parameterstore.base.value
  instance_type = local.instance_type
  subnet_id     = var.subnet_id == "" ? null : var.subnet_id
  ssh_username  = "admin"

  temporary_key_pair_type = "ed25519"

  ami_name        = "gridfleet-node-${local.stamp}"
  ami_description = "gridfleet node (${var.arch}): Debian 12 with Chromium, a JRE, amazon-ssm-agent, amazon-efs-utils, the crawl user and gridfleet's dependencies"
  imds_support    = "v2.0"
  encrypt_boot    = true
  kms_key_id      = var.kms_key_id == "" ? null : var.kms_key_id

  # The build instance, as the nodes: IMDSv2 only.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  launch_block_device_mappings {
    device_name           = "/dev/xvda"
    volume_type           = "gp3"
    volume_size           = 8
    encrypted             = true
    delete_on_termination = true
  }

  # What a preflight check reads to know a baked node image and what it holds:
  # the packages bake.sh installs that a stock Debian image lacks (space-separated),
  # and the Python its venv is for (Debian 12's; fleet.yaml's aws.image_python).
  tags = {
    Name               = "gridfleet-node-${local.stamp}"
    "gridfleet:image"  = "node"
    "gridfleet:baked"  = "amazon-ssm-agent amazon-efs-utils"
    "gridfleet:python" = "3.11"
    "gridfleet:bundle" = basename(var.bundle)
    "gridfleet:base"   = data.amazon-parameterstore.base.value
  }
}

build {
  sources = ["source.amazon-ebs.node"]

  provisioner "shell" {
    inline = ["mkdir -p ${local.work_dir}"]
  }

  provisioner "file" {
    sources     = compact([var.bundle, var.efs_utils_deb, "${path.root}/bake.sh"])
    destination = "${local.work_dir}/"
  }

  provisioner "shell" {
    environment_vars = [
      "GRIDFLEET_CRAWL_USER=${var.crawl_user}",
      "GRIDFLEET_CRAWL_UID=${var.crawl_uid}",
      "GRIDFLEET_REGION=${var.region}", # where the SSM agent's package comes from
    ]
    execute_command = "chmod +x {{ .Path }}; sudo -n env {{ .Vars }} {{ .Path }}"
    inline = [
      "bash ${local.work_dir}/bake.sh ${local.work_dir}/${basename(var.bundle)} ${local.deb_arg}",
      "rm -rf ${local.work_dir}",
    ]
  }

  post-processor "manifest" {
    output     = "packer-manifest.json"
    strip_path = true
  }
}
