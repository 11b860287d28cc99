# Inputs of one region's regiond deployment. Most map one to one onto a
# regiond flag (README.md lists the mapping); the rest shape the Kubernetes
# objects around it.

# ---- identity of the region ------------------------------------------------

variable "region" {
  description = "This region's name (-region). Lower-case letters, digits, '-' and '_': regiond's rule, stricter than a NATS subject token, since the name becomes the subject ration.sync.<region>."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9_-]+$", var.region))
    error_message = "region must be lower-case letters, digits, '-' and '_' (it is a NATS subject token and part of Kubernetes names)."
  }
}

variable "regions" {
  description = "All regions of the deployment, this one included (-regions). Must be the same list in every region: each region starts with an equal part of every global quota."
  type        = list(string)

  validation {
    condition     = alltrue([for r in var.regions : can(regex("^[a-z0-9_-]+$", r))])
    error_message = "every region name must be lower-case letters, digits, '-' and '_'."
  }
  validation {
    condition     = length(distinct(var.regions)) == length(var.regions)
    error_message = "regions lists a region twice."
  }
  validation {
    condition     = contains(var.regions, var.region)
    error_message = "regions must include this region (var.region)."
  }
}

# ---- Kubernetes placement ---------------------------------------------------

variable "namespace" {
  description = "Namespace of every object (it must exist)."
  type        = string
  default     = "ration"

  validation {
    condition     = can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.namespace))
    error_message = "namespace must be a DNS-1123 label."
  }
}

variable "name" {
  description = "Name of the Deployment, Service, ConfigMap, Secret and PodDisruptionBudget (default regiond-<region>, '_' replaced by '-')."
  type        = string
  default     = null

  validation {
    condition     = var.name == null || can(regex("^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", var.name))
    error_message = "name must be a DNS-1123 label (lower-case letters, digits and '-', at most 63 characters)."
  }
}

variable "labels" {
  description = "Extra labels on every object and pod."
  type        = map(string)
  default     = {}
}

variable "replicas" {
  description = "regiond replicas of this region. They share the region's Redis and keep no token state; one at a time (holding a lease on a Redis key) runs the exchange, and another takes over when it dies."
  type        = number
  default     = 2

  validation {
    condition     = var.replicas >= 1 && floor(var.replicas) == var.replicas
    error_message = "replicas must be a whole number, at least 1."
  }
}

variable "image" {
  description = "Container image holding the regiond binary (built from ./cmd/regiond)."
  type        = string

  validation {
    condition     = length(trimspace(var.image)) > 0
    error_message = "image must be set."
  }
}

variable "image_pull_policy" {
  description = "Image pull policy of the regiond container."
  type        = string
  default     = "IfNotPresent"

  validation {
    condition     = contains(["Always", "IfNotPresent", "Never"], var.image_pull_policy)
    error_message = "image_pull_policy must be Always, IfNotPresent or Never."
  }
}

variable "command" {
  description = "Entrypoint that runs regiond in the image; the flags are passed as args."
  type        = list(string)
  default     = ["regiond"]
}

variable "resources" {
  description = "Resource requests and limits of the regiond container. No CPU limit by default: CFS throttling stalls a daemon whose leases live 100ms."
  type = object({
    requests = map(string)
    limits   = map(string)
  })
  default = {
    requests = { cpu = "250m", memory = "128Mi" }
    limits   = { memory = "512Mi" }
  }
}

variable "node_selector" {
  description = "Node selector of the pods."
  type        = map(string)
  default     = {}
}

variable "service_type" {
  description = "Type of the Service in front of the lease API and the admin port. ClusterIP when the gateways run in the same cluster."
  type        = string
  default     = "ClusterIP"

  validation {
    condition     = contains(["ClusterIP", "NodePort", "LoadBalancer"], var.service_type)
    error_message = "service_type must be ClusterIP, NodePort or LoadBalancer."
  }
}

variable "cluster_domain" {
  description = "The cluster's DNS domain, for the addresses in the outputs."
  type        = string
  default     = "cluster.local"
}

variable "pdb_max_unavailable" {
  description = "PodDisruptionBudget: how many regiond pods a voluntary disruption (a node drain) may take down at once."
  type        = number
  default     = 1

  validation {
    condition     = var.pdb_max_unavailable >= 1 && floor(var.pdb_max_unavailable) == var.pdb_max_unavailable
    error_message = "pdb_max_unavailable must be a whole number, at least 1 (0 blocks every node drain)."
  }
}

# ---- connections (secret) -----------------------------------------------------

variable "redis_url" {
  description = "The region's Redis (-redis): redis://[user:password@]host:port/db, rediss://..., or host:port,host:port for Redis Cluster. Stored in a Kubernetes Secret and passed as -redis=$(REDIS_URL). Required unless credentials_secret is set: the embedded memory store is per process, so replicas would each hold the region's whole share."
  type        = string
  default     = ""
  sensitive   = true

  validation {
    condition     = var.redis_url == "" || can(regex("^(rediss?://[^\\s,]+|[^\\s/,]+:[0-9]+(,[^\\s/,]+:[0-9]+)*)$", var.redis_url))
    error_message = "redis_url must be a redis:// or rediss:// URL, or host:port,host:port for Redis Cluster."
  }
  validation {
    condition     = var.redis_url != "" || var.credentials_secret != null
    error_message = "set redis_url (or credentials_secret): without Redis each replica keeps its own memory store and holds the region's whole share."
  }
}

variable "nats_urls" {
  description = "NATS servers of this region's side of the exchange (-nats), usually the region's cluster of a supercluster, credentials in the URL (nats://user:password@host:4222). Empty: no exchange, the region holds every quota alone (only right for a single region)."
  type        = list(string)
  default     = []
  sensitive   = true

  validation {
    condition     = alltrue([for u in var.nats_urls : can(regex("^(nats|tls|ws|wss)://[^\\s,]+$", u))])
    error_message = "each NATS URL must be nats://, tls://, ws:// or wss:// with no spaces or commas."
  }
  validation {
    condition     = length(var.regions) == 1 || length(var.nats_urls) > 0 || var.credentials_secret != null
    error_message = "several regions need nats_urls (or credentials_secret): without an exchange every region would hold the whole quota."
  }
}

variable "credentials_secret" {
  description = "Name of an existing Secret in the namespace with keys REDIS_URL and NATS_URL (comma-separated), used instead of redis_url and nats_urls so the credentials stay out of Terraform state."
  type        = string
  default     = null
}

variable "admin_token_secret" {
  description = "Name of an existing Secret in the namespace with a key token (at least 16 bytes): /metrics then requires it as a bearer token (-admin-token-file; the scraper must send it), and a rotated Secret is in force without a restart. /healthz and /readyz stay open for the kubelet's probes. Null leaves /metrics open on the pod network."
  type        = string
  default     = null
}

variable "redis_tls_secret" {
  description = "Name of an existing Secret in the namespace with the CA that verifies Redis (ca.crt) and a client certificate for it (tls.crt, tls.key): regiond then connects to Redis over TLS (-redis-ca, -redis-cert, -redis-key). Put the ACL user and password in redis_url (or credentials_secret)."
  type        = string
  default     = null
}

variable "nats_tls_secret" {
  description = "Name of an existing Secret in the namespace with the CA that verifies the NATS servers (ca.crt) and a client certificate (tls.crt, tls.key): regiond then connects to NATS over TLS (-nats-ca, -nats-cert, -nats-key)."
  type        = string
  default     = null
}

variable "nats_nkey_secret" {
  description = "Name of an existing Secret in the namespace with key seed, the seed of the nkey user this region connects to NATS as (-nats-nkey); give that user publish on ration.sync.<region> and subscribe on ration.sync.> only."
  type        = string
  default     = null
}

variable "nats_creds_secret" {
  description = "Name of an existing Secret in the namespace with key creds, the .creds file (user JWT and nkey seed) this region connects to a NATS in operator mode with (-nats-creds); exclusive with nats_nkey_secret."
  type        = string
  default     = null

  validation {
    condition     = var.nats_creds_secret == null || var.nats_creds_secret != ""
    error_message = "nats_creds_secret must name a Secret, or be null."
  }
}

variable "lease_tls_secret" {
  description = "Name of an existing Secret in the namespace with the lease API's server certificate and key (tls.crt, tls.key) and the CA that agents' client certificates must chain to (ca.crt), as cert-manager writes them: regiond then serves the lease API over mTLS (-tls-cert, -tls-key, -tls-client-ca) and reads the files again when the Secret is renewed. Null serves it in plain text on the pod network (-insecure), for a network that is private or encrypted by a mesh."
  type        = string
  default     = null
}

# ---- the exchange and the lease API ------------------------------------------
#
# Durations are Go duration strings. The pattern accepts a subset of Go's
# syntax (no sign, no bare "0"): whatever it accepts, time.ParseDuration does.

variable "sync_period" {
  description = "The exchange's epoch (-sync-period). Must be the same in every region; epochs start on wall-clock multiples of it, so keep clocks NTP-synced."
  type        = string
  default     = "1s"

  validation {
    condition     = can(regex("^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$", var.sync_period))
    error_message = "sync_period must be a Go duration such as 1s or 500ms."
  }
}

variable "decide_after" {
  description = "How long after publishing its tallies a region decides (-decide-after): more than the one-way delay between regions plus clock skew, below sync_period/2. Empty: regiond's default, a quarter period."
  type        = string
  default     = ""

  validation {
    condition     = var.decide_after == "" || can(regex("^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$", var.decide_after))
    error_message = "decide_after must be empty or a Go duration such as 250ms."
  }
}

variable "lease_ttl" {
  description = "Lifetime τ of an agent's lease (-lease-ttl); it enters the overshoot bound as L·τ."
  type        = string
  default     = "100ms"

  validation {
    condition     = can(regex("^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$", var.lease_ttl))
    error_message = "lease_ttl must be a Go duration such as 100ms."
  }
}

variable "store_timeout" {
  description = "Deadline of each Redis call (-store-timeout)."
  type        = string
  default     = "50ms"

  validation {
    condition     = can(regex("^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$", var.store_timeout))
    error_message = "store_timeout must be a Go duration such as 50ms."
  }
}

variable "shutdown_grace_seconds" {
  description = "How long in-flight calls may take to finish after SIGTERM (-grace). The pod's terminationGracePeriodSeconds is this plus 5s, so the kubelet never kills regiond mid-shutdown."
  type        = number
  default     = 10

  validation {
    condition     = var.shutdown_grace_seconds >= 1 && floor(var.shutdown_grace_seconds) == var.shutdown_grace_seconds
    error_message = "shutdown_grace_seconds must be a whole number of seconds, at least 1."
  }
}

variable "log_level" {
  description = "regiond's log level (-log-level)."
  type        = string
  default     = "info"

  validation {
    condition     = contains(["debug", "info", "warn", "error"], var.log_level)
    error_message = "log_level must be debug, info, warn or error."
  }
}

# ---- policy -------------------------------------------------------------------

variable "policy_yaml" {
  description = "The policy (rules) as YAML, put in a ConfigMap and passed as -policy. Must be the same in every region. regiond watches the file: a change is applied without a restart once the kubelet refreshes the mounted ConfigMap (about a minute). Leave it empty with policy_store."
  type        = string
  default     = ""

  validation {
    condition     = var.policy_yaml == "" || can(yamldecode(var.policy_yaml).rules)
    error_message = "policy_yaml must be a YAML mapping with a rules field (or empty, with policy_store); regiond validates the rules themselves."
  }
}

variable "policy_store" {
  description = "The policy store's bucket on the NATS of nats_url (passed as -policy nats-kv://BUCKET instead of the file): every region follows one versioned policy that `ration policy push` writes. The region's NATS user needs embedded.PolicyReader's subjects. Empty: the policy_yaml file."
  type        = string
  default     = ""

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{0,64}$", var.policy_store))
    error_message = "policy_store must be a bucket name of letters, digits, '-' and '_' (at most 64), or empty."
  }
}

variable "policy_path" {
  description = "Where the policy file is mounted in the container (-policy). Its directory holds only the ConfigMap."
  type        = string
  default     = "/etc/ration/policy.yaml"

  validation {
    condition     = can(regex("^(/[A-Za-z0-9._-]+)+/[A-Za-z0-9._-]+$", var.policy_path))
    error_message = "policy_path must be an absolute file path below a directory other than / (the ConfigMap is mounted on that directory)."
  }
}

# ---- ports ----------------------------------------------------------------------

variable "lease_port" {
  description = "Port of the lease API, gRPC (-listen :PORT); agents' -regiond points at the Service on it."
  type        = number
  default     = 7070

  validation {
    condition     = var.lease_port >= 1 && var.lease_port <= 65535 && floor(var.lease_port) == var.lease_port
    error_message = "lease_port must be a port number."
  }
}

variable "admin_port" {
  description = "Port of the admin HTTP server (-admin :PORT): /healthz, /readyz and /metrics."
  type        = number
  default     = 7071

  validation {
    condition     = var.admin_port >= 1 && var.admin_port <= 65535 && floor(var.admin_port) == var.admin_port && var.admin_port != var.lease_port
    error_message = "admin_port must be a port number other than lease_port."
  }
}
