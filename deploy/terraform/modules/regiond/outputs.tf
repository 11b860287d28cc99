output "service_name" {
  description = "Name of the Service in front of the lease API and the admin port."
  value       = kubernetes_service_v1.regiond.metadata[0].name
}

output "namespace" {
  description = "Namespace of the deployment."
  value       = var.namespace
}

output "lease_api_address" {
  description = "host:port of the lease API (gRPC) inside the cluster: what agents' -regiond (cmd/agent) or agent.Config.Target points at."
  value       = "${kubernetes_service_v1.regiond.metadata[0].name}.${var.namespace}.svc.${var.cluster_domain}:${var.lease_port}"
}

output "admin_address" {
  description = "host:port of the admin HTTP server behind the Service: /healthz, /readyz and /metrics (each replica's own; Prometheus scrapes the pods through their annotations)."
  value       = "${kubernetes_service_v1.regiond.metadata[0].name}.${var.namespace}.svc.${var.cluster_domain}:${var.admin_port}"
}

output "args" {
  description = "The flags regiond runs with (the credentials appear as $(REDIS_URL) and $(NATS_URL), expanded from the Secret)."
  value       = local.args
}
