# Optional (var.example_gateway): a gateway pod in us running Envoy with
# cmd/agent as its sidecar rate limit service. Envoy asks the agent on
# loopback; the agent decides from tokens leased in batches from us's regiond
# (module.regiond_us.lease_api_address), so no request waits on the network
# in steady state. Copy the agent container into your own gateway pods.

locals {
  agent_port       = 8081
  agent_admin_port = 8082
  gateway_port     = 8080
  upstream         = split(":", var.gateway_upstream)
}

resource "kubernetes_config_map_v1" "gateway_envoy" {
  count    = var.example_gateway ? 1 : 0
  provider = kubernetes.us

  metadata {
    name      = "gateway-envoy"
    namespace = var.namespace
  }

  data = {
    "envoy.yaml" = templatefile("${path.module}/envoy.yaml.tftpl", {
      listen_port   = local.gateway_port
      agent_port    = local.agent_port
      upstream_host = local.upstream[0]
      upstream_port = local.upstream[1]
    })
  }
}

resource "kubernetes_deployment_v1" "gateway" {
  count    = var.example_gateway ? 1 : 0
  provider = kubernetes.us

  metadata {
    name      = "gateway"
    namespace = var.namespace
  }

  spec {
    replicas = 2

    selector {
      match_labels = { "app.kubernetes.io/name" = "gateway" }
    }

    template {
      metadata {
        labels = { "app.kubernetes.io/name" = "gateway" }
        annotations = {
          "prometheus.io/scrape" = "true"
          "prometheus.io/port"   = tostring(local.agent_admin_port)
          "prometheus.io/path"   = "/metrics"
        }
      }

      spec {
        # The agent returns its unused tokens to the region when it stops;
        # give its -grace room before the kubelet's SIGKILL.
        termination_grace_period_seconds = 15

        container {
          name  = "envoy"
          image = var.envoy_image
          args  = ["-c", "/etc/envoy/envoy.yaml"]

          port {
            name           = "http"
            container_port = local.gateway_port
          }

          volume_mount {
            name       = "envoy"
            mount_path = "/etc/envoy"
            read_only  = true
          }
        }

        container {
          name    = "ration-agent"
          image   = var.image
          command = ["/usr/local/bin/agent"]
          args = [
            "-regiond=${module.regiond_us.lease_api_address}",
            # Loopback only: Envoy in the same pod is its one client.
            "-listen=127.0.0.1:${local.agent_port}",
            "-admin=:${local.agent_admin_port}",
            "-grace=5s",
          ]

          port {
            name           = "agent-admin"
            container_port = local.agent_admin_port
          }

          # Ready once the first policy arrived from the region; it stays
          # ready through later outages, when the rules' failure modes decide.
          readiness_probe {
            http_get {
              path = "/readyz"
              port = "agent-admin"
            }
            period_seconds = 2
          }
          liveness_probe {
            http_get {
              path = "/healthz"
              port = "agent-admin"
            }
            period_seconds = 10
          }

          resources {
            requests = { cpu = "100m", memory = "64Mi" }
            limits   = { memory = "256Mi" }
          }

          security_context {
            run_as_non_root            = true
            run_as_user                = "65532"
            allow_privilege_escalation = false
            read_only_root_filesystem  = true
            capabilities {
              drop = ["ALL"]
            }
          }
        }

        volume {
          name = "envoy"
          config_map {
            name = kubernetes_config_map_v1.gateway_envoy[0].metadata[0].name
          }
        }
      }
    }
  }
}
