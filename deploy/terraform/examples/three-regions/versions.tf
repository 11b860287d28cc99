terraform {
  required_version = ">= 1.9.0"

  required_providers {
    kubernetes = {
      source  = "hashicorp/kubernetes"
      version = "~> 2.31"
    }
  }
}

# One provider per region's cluster, each a context of the same kubeconfig.
provider "kubernetes" {
  alias          = "us"
  config_path    = var.kubeconfig_path
  config_context = var.kube_contexts["us"]
}

provider "kubernetes" {
  alias          = "eu"
  config_path    = var.kubeconfig_path
  config_context = var.kube_contexts["eu"]
}

provider "kubernetes" {
  alias          = "ap"
  config_path    = var.kubeconfig_path
  config_context = var.kube_contexts["ap"]
}
