# One region's regiond: a Deployment of stateless replicas on the region's
# Redis, a Service for the lease API (what agents dial) and the admin port, the
# policy in a ConfigMap, the connection URLs in a Secret, and a
# PodDisruptionBudget.

locals {
  name = coalesce(var.name, "regiond-${replace(var.region, "_", "-")}")

  selector = {
    "app.kubernetes.io/name"     = "regiond"
    "app.kubernetes.io/instance" = local.name
  }
  labels = merge(var.labels, local.selector, {
    "app.kubernetes.io/part-of"    = "ration"
    "app.kubernetes.io/managed-by" = "terraform"
    "ration.dev/region"            = var.region
  })

  secret_name = var.credentials_secret != null ? var.credentials_secret : kubernetes_secret_v1.urls[0].metadata[0].name
  policy_file = basename(var.policy_path)
  policy_dir  = dirname(var.policy_path)

  # Milliseconds of the Go durations (validated by their variables), for the
  # cross-checks that need arithmetic: regiond refuses a decide-after of half
  # the sync period or more, and a pod that crash-loops on a flag is a worse
  # place to learn it than the plan.
  duration_unit_ms = { ns = 0.000001, us = 0.001, "µs" = 0.001, ms = 1, s = 1000, m = 60000, h = 3600000 }
  sync_period_ms   = sum(concat([0], [for p in regexall("([0-9.]+)(ns|us|µs|ms|s|m|h)", var.sync_period) : tonumber(p[0]) * local.duration_unit_ms[p[1]]]))
  decide_after_ms  = sum(concat([0], [for p in regexall("([0-9.]+)(ns|us|µs|ms|s|m|h)", var.decide_after) : tonumber(p[0]) * local.duration_unit_ms[p[1]]]))

  # regiond's flags. The Redis and NATS URLs carry credentials, so they come
  # from the Secret through the environment: Kubernetes expands $(VAR) in
  # args from the container's env, and the Deployment spec (and kubectl
  # describe) shows only the reference. An empty NATS_URL means no exchange.
  args = concat([
    "-region=${var.region}",
    "-regions=${join(",", var.regions)}",
    "-listen=:${var.lease_port}",
    "-admin=:${var.admin_port}",
    "-redis=$(REDIS_URL)",
    "-nats=$(NATS_URL)",
    "-policy=${var.policy_store == "" ? var.policy_path : "nats-kv://${var.policy_store}"}",
    "-sync-period=${var.sync_period}",
    "-lease-ttl=${var.lease_ttl}",
    "-store-timeout=${var.store_timeout}",
    "-grace=${var.shutdown_grace_seconds}s",
    "-log-level=${var.log_level}",
    ], var.decide_after == "" ? [] : ["-decide-after=${var.decide_after}"],
    # The lease API over mTLS from a Secret, or in plain text on the pod
    # network, which regiond refuses beyond loopback without -insecure.
    var.lease_tls_secret == null ? ["-insecure"] : [
      "-tls-cert=${local.tls_dir}/tls.crt",
      "-tls-key=${local.tls_dir}/tls.key",
      "-tls-client-ca=${local.tls_dir}/ca.crt",
    ],
    var.admin_token_secret == null ? [] : ["-admin-token-file=${local.admin_token_dir}/token"],
    var.redis_tls_secret == null ? [] : [
      "-redis-ca=${local.redis_tls_dir}/ca.crt",
      "-redis-cert=${local.redis_tls_dir}/tls.crt",
      "-redis-key=${local.redis_tls_dir}/tls.key",
    ],
    var.nats_tls_secret == null ? [] : [
      "-nats-ca=${local.nats_tls_dir}/ca.crt",
      "-nats-cert=${local.nats_tls_dir}/tls.crt",
      "-nats-key=${local.nats_tls_dir}/tls.key",
    ],
    var.nats_nkey_secret == null ? [] : ["-nats-nkey=${local.nats_nkey_dir}/seed"],
  var.nats_creds_secret == null ? [] : ["-nats-creds=${local.nats_creds_dir}/creds"])
  tls_dir         = "/etc/ration/tls"
  admin_token_dir = "/etc/ration/admin"
  redis_tls_dir   = "/etc/ration/redis-tls"
  nats_tls_dir    = "/etc/ration/nats-tls"
  nats_nkey_dir   = "/etc/ration/nats-nkey"
  nats_creds_dir  = "/etc/ration/nats-creds"
  # The Secrets mounted as files: name (a volume's), mount path, Secret.
  secret_mounts = [for m in [
    { name = "lease-tls", path = local.tls_dir, secret = var.lease_tls_secret },
    { name = "admin-token", path = local.admin_token_dir, secret = var.admin_token_secret },
    { name = "redis-tls", path = local.redis_tls_dir, secret = var.redis_tls_secret },
    { name = "nats-tls", path = local.nats_tls_dir, secret = var.nats_tls_secret },
    { name = "nats-nkey", path = local.nats_nkey_dir, secret = var.nats_nkey_secret },
    { name = "nats-creds", path = local.nats_creds_dir, secret = var.nats_creds_secret },
  ] : m if m.secret != null]
}

resource "kubernetes_config_map_v1" "policy" {
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }

  data = {
    (local.policy_file) = var.policy_yaml
  }
}

resource "kubernetes_secret_v1" "urls" {
  count = var.credentials_secret == null ? 1 : 0

  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }

  data = {
    REDIS_URL = var.redis_url
    NATS_URL  = join(",", var.nats_urls)
  }
}

resource "kubernetes_deployment_v1" "regiond" {
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }

  spec {
    replicas = var.replicas

    selector {
      match_labels = local.selector
    }

    # Bring a new replica up before taking an old one down: the region keeps
    # its capacity, and the exchange lease moves to a live replica.
    strategy {
      type = "RollingUpdate"
      rolling_update {
        max_surge       = "1"
        max_unavailable = "0"
      }
    }

    template {
      metadata {
        labels = local.labels
        # No checksum of the policy here on purpose: regiond watches the
        # mounted file and applies a valid change live, so a policy edit must
        # not restart the pods.
        annotations = {
          "prometheus.io/scrape" = "true"
          "prometheus.io/port"   = tostring(var.admin_port)
          "prometheus.io/path"   = "/metrics"
        }
      }

      spec {
        # regiond never talks to the Kubernetes API.
        automount_service_account_token = false
        # Above -grace, so the kubelet's SIGKILL never cuts regiond's own
        # shutdown (drain calls, give up the exchange lease, close Redis).
        termination_grace_period_seconds = var.shutdown_grace_seconds + 5
        node_selector                    = var.node_selector

        security_context {
          run_as_non_root = true
          run_as_user     = "65532"
          run_as_group    = "65532"
          seccomp_profile {
            type = "RuntimeDefault"
          }
        }

        # Spread replicas over zones and nodes, so one failure leaves the
        # region a replica to serve leases and take over the exchange.
        topology_spread_constraint {
          max_skew           = 1
          topology_key       = "topology.kubernetes.io/zone"
          when_unsatisfiable = "ScheduleAnyway"
          label_selector {
            match_labels = local.selector
          }
        }
        topology_spread_constraint {
          max_skew           = 1
          topology_key       = "kubernetes.io/hostname"
          when_unsatisfiable = "ScheduleAnyway"
          label_selector {
            match_labels = local.selector
          }
        }

        container {
          name              = "regiond"
          image             = var.image
          image_pull_policy = var.image_pull_policy
          command           = var.command
          args              = local.args

          env {
            name = "REDIS_URL"
            value_from {
              secret_key_ref {
                name = local.secret_name
                key  = "REDIS_URL"
              }
            }
          }
          env {
            name = "NATS_URL"
            value_from {
              secret_key_ref {
                name = local.secret_name
                key  = "NATS_URL"
              }
            }
          }

          port {
            name           = "grpc"
            container_port = var.lease_port
            protocol       = "TCP"
          }
          port {
            name           = "admin"
            container_port = var.admin_port
            protocol       = "TCP"
          }

          # /readyz fails while no policy is loaded or Redis does not answer:
          # the Service then stops sending new lease calls to this replica,
          # and agents apply their rules' failure modes if none is ready.
          readiness_probe {
            http_get {
              path = "/readyz"
              port = "admin"
            }
            period_seconds    = 5
            timeout_seconds   = 2
            failure_threshold = 2
          }
          # /healthz answers while the process serves HTTP; a Redis outage
          # must not restart pods (it would not fix Redis).
          liveness_probe {
            http_get {
              path = "/healthz"
              port = "admin"
            }
            initial_delay_seconds = 5
            period_seconds        = 10
            timeout_seconds       = 2
            failure_threshold     = 3
          }

          resources {
            requests = var.resources.requests
            limits   = var.resources.limits
          }

          security_context {
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            capabilities {
              drop = ["ALL"]
            }
          }

          # The whole directory, not a subPath: the kubelet updates a
          # ConfigMap volume in place (subPath mounts never change), and
          # regiond's watcher picks the new file up.
          volume_mount {
            name       = "policy"
            mount_path = local.policy_dir
            read_only  = true
          }
          dynamic "volume_mount" {
            for_each = local.secret_mounts
            content {
              name       = volume_mount.value.name
              mount_path = volume_mount.value.path
              read_only  = true
            }
          }
        }

        volume {
          name = "policy"
          config_map {
            name = kubernetes_config_map_v1.policy.metadata[0].name
          }
        }
        dynamic "volume" {
          for_each = local.secret_mounts
          content {
            name = volume.value.name
            secret {
              secret_name = volume.value.secret
            }
          }
        }
      }
    }
  }

  lifecycle {
    precondition {
      condition     = (var.policy_yaml == "") != (var.policy_store == "")
      error_message = "give policy_yaml (a file) or policy_store (the bucket of the policy store), exactly one."
    }
    precondition {
      condition     = var.nats_nkey_secret == null || var.nats_creds_secret == null
      error_message = "give nats_nkey_secret or nats_creds_secret, not both: regiond refuses both."
    }
    precondition {
      condition     = length(local.name) <= 63
      error_message = "the name regiond-<region> is longer than 63 characters; set var.name."
    }
    precondition {
      condition     = local.sync_period_ms >= 1
      error_message = "sync_period must be at least 1ms."
    }
    precondition {
      condition     = var.decide_after == "" || 2 * local.decide_after_ms < local.sync_period_ms
      error_message = "decide_after must be below half of sync_period (regiond refuses it otherwise)."
    }
  }
}

resource "kubernetes_service_v1" "regiond" {
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }

  spec {
    type     = var.service_type
    selector = local.selector

    # Named grpc so that meshes (Istio) treat the port as gRPC.
    port {
      name        = "grpc"
      port        = var.lease_port
      target_port = "grpc"
      protocol    = "TCP"
    }
    port {
      name        = "http-admin"
      port        = var.admin_port
      target_port = "admin"
      protocol    = "TCP"
    }
  }
}

resource "kubernetes_pod_disruption_budget_v1" "regiond" {
  metadata {
    name      = local.name
    namespace = var.namespace
    labels    = local.labels
  }

  spec {
    max_unavailable = tostring(var.pdb_max_unavailable)
    selector {
      match_labels = local.selector
    }
  }
}
