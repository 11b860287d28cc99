variable "kubeconfig_path" {
  description = "kubeconfig holding a context for each region's cluster."
  type        = string
  default     = "~/.kube/config"
}

variable "kube_contexts" {
  description = "kubeconfig context of each region's cluster."
  type        = map(string)
  default = {
    us = "ration-us"
    eu = "ration-eu"
    ap = "ration-ap"
  }

  validation {
    condition     = alltrue([for r in ["us", "eu", "ap"] : contains(keys(var.kube_contexts), r)])
    error_message = "kube_contexts needs a context for us, eu and ap."
  }
}

variable "namespace" {
  description = "Namespace for ration in every cluster (it must exist)."
  type        = string
  default     = "ration"
}

variable "image" {
  description = "Image built by the repository's Dockerfile (regiond, agent and ration in /usr/local/bin), e.g. ghcr.io/ration-dev/ration:v0.1.0: see deploy/README.md."
  type        = string
}

variable "redis_urls" {
  description = "Each region's own Redis: redis://[user:password@]host:port/db, rediss://..., or host:port,host:port for Redis Cluster."
  type        = map(string)
  sensitive   = true
}

variable "nats_urls" {
  description = "Each region's servers of the one NATS supercluster (its cluster in that region), with the region's own NATS user in the URL: the account lets it publish only ration.sync.<region>."
  type        = map(list(string))
  sensitive   = true
}

variable "example_gateway" {
  description = "Also deploy gateway.tf's example gateway in us: Envoy with cmd/agent as its rate limit service sidecar."
  type        = bool
  default     = false
}

variable "envoy_image" {
  description = "Envoy image of the example gateway."
  type        = string
  default     = "envoyproxy/envoy:v1.34-latest"
}

variable "gateway_upstream" {
  description = "host:port the example gateway proxies to."
  type        = string
  default     = "backend.default.svc.cluster.local:8080"
}
