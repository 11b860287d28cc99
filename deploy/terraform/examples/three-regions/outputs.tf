output "lease_api_addresses" {
  description = "Each region's lease API (host:port inside its cluster): the -regiond of that region's agents."
  value = {
    us = module.regiond_us.lease_api_address
    eu = module.regiond_eu.lease_api_address
    ap = module.regiond_ap.lease_api_address
  }
}

output "admin_addresses" {
  description = "Each region's admin address (/healthz, /readyz, /metrics) inside its cluster."
  value = {
    us = module.regiond_us.admin_address
    eu = module.regiond_eu.admin_address
    ap = module.regiond_ap.admin_address
  }
}
