# ration in three regions: one regiond deployment per region, each in its own
# cluster, on its own Redis, all exchanging reports over one NATS
# supercluster. What must be equal everywhere lives in locals, so the regions
# cannot drift apart.

locals {
  # Every region lists every region (each starts with an equal part of every
  # global quota), uses the same epoch (epochs start on wall-clock multiples
  # of it: keep the clusters' clocks NTP-synced), and enforces the same rules.
  regions     = ["us", "eu", "ap"]
  sync_period = "1s"
  # The decision comes this long after the tallies are published; above the
  # one-way delay between the farthest regions (us-ap) plus clock skew.
  decide_after = "250ms"
  policy_yaml  = file("${path.module}/policy.yaml")
  # The image the repository's Dockerfile builds holds regiond, agent and
  # ration in /usr/local/bin; its entrypoint is regiond, named here anyway so
  # that another image with the same layout works too.
  regiond_command = ["/usr/local/bin/regiond"]
}

module "regiond_us" {
  source    = "../../modules/regiond"
  providers = { kubernetes = kubernetes.us }

  region       = "us"
  regions      = local.regions
  sync_period  = local.sync_period
  decide_after = local.decide_after
  policy_yaml  = local.policy_yaml

  namespace = var.namespace
  image     = var.image
  command   = local.regiond_command
  redis_url = var.redis_urls["us"]
  nats_urls = var.nats_urls["us"]
}

module "regiond_eu" {
  source    = "../../modules/regiond"
  providers = { kubernetes = kubernetes.eu }

  region       = "eu"
  regions      = local.regions
  sync_period  = local.sync_period
  decide_after = local.decide_after
  policy_yaml  = local.policy_yaml

  namespace = var.namespace
  image     = var.image
  command   = local.regiond_command
  redis_url = var.redis_urls["eu"]
  nats_urls = var.nats_urls["eu"]
}

module "regiond_ap" {
  source    = "../../modules/regiond"
  providers = { kubernetes = kubernetes.ap }

  region       = "ap"
  regions      = local.regions
  sync_period  = local.sync_period
  decide_after = local.decide_after
  policy_yaml  = local.policy_yaml

  namespace = var.namespace
  image     = var.image
  command   = local.regiond_command
  redis_url = var.redis_urls["ap"]
  nats_urls = var.nats_urls["ap"]
  # ap's gateways are fewer; two replicas still survive a node loss.
  replicas = 2
}
