// Package envoyimport converts the configuration of Envoy's reference rate
// limit service (github.com/envoyproxy/ratelimit) into ration policy rules
// that decide the same through ration's Envoy adapter (lease/agent/envoyrls).
//
// Envoy's service walks a domain's descriptor tree entry by entry: at each
// level a node for the entry's key and value wins over a node for the key
// alone, and a rate_limit applies only at the node the descriptor's last
// entry reaches. ration matches rules against a set of descriptors, all of
// them at once, so each node with a rate_limit becomes one rule that
// matches the domain (DomainKey), the descriptor's keys in order (KeysKey,
// which the adapter adds) and the node's values, keyed by every entry's
// value, with except for the values of sibling nodes that Envoy tries
// first: exact values before a trailing-* pattern (match_prefix), patterns
// in file order, the key alone last. share_threshold leaves the entry out
// of the key. Each rule is a fixed window of the node's unit (UTC seconds,
// minutes, hours, days, as Envoy counts), scope global.
//
// To start:
//
//	res, err := envoyimport.Convert([]envoyimport.File{{Name: "config.yaml", Data: data}})
//	...
//	os.Stdout.Write(res.Set.Source())
//
// What cannot be converted to the same meaning (a * within a value,
// requests_per_unit: 0, quota_mode, metadata, week/month/year units, a node
// no request reaches) is an error naming the file, line and field; fields
// that only change Envoy's metrics (detailed_metric, value_to_metric)
// become Notes.
package envoyimport
