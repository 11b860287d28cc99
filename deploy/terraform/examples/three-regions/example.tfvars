# Copy to terraform.tfvars (kept out of version control) and fill in.
# The image the repository's Dockerfile builds, pushed where the clusters pull
# from (deploy/README.md): the tag is the release you deploy.
image = "ghcr.io/ration-dev/ration:v0.1.0"

redis_urls = {
  us = "rediss://default:CHANGE-ME@redis.us.internal:6379/0"
  eu = "rediss://default:CHANGE-ME@redis.eu.internal:6379/0"
  ap = "redis-0.ap.internal:6379,redis-1.ap.internal:6379,redis-2.ap.internal:6379"
}

# One supercluster: each region connects to its own cluster's servers, as
# its own user (publish ration.sync.<region>, subscribe ration.sync.>).
nats_urls = {
  us = ["nats://ration-us:CHANGE-ME@nats-0.us.internal:4222", "nats://ration-us:CHANGE-ME@nats-1.us.internal:4222"]
  eu = ["nats://ration-eu:CHANGE-ME@nats-0.eu.internal:4222", "nats://ration-eu:CHANGE-ME@nats-1.eu.internal:4222"]
  ap = ["nats://ration-ap:CHANGE-ME@nats-0.ap.internal:4222", "nats://ration-ap:CHANGE-ME@nats-1.ap.internal:4222"]
}
