terraform {
  # 1.9: validation conditions may refer to other variables (regions must
  # include region, decide_after is checked against sync_period).
  required_version = ">= 1.9.0"

  required_providers {
    kubernetes = {
      source = "hashicorp/kubernetes"
      # The *_v1 resources, topology spread constraints and seccomp profiles
      # used here are all in 2.31; a 3.x release may change the schema.
      version = "~> 2.31"
    }
  }
}
