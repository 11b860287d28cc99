// Package syncv1 holds the generated code of the cross-region exchange's
// wire format (sync.proto): the usage reports regiond replicas publish on
// NATS and the exchange state a region persists in its store. The codec
// that turns them into region.Report and region.Snapshot is in
// sync/codec.
package syncv1

//go:generate protoc --go_out=. --go_opt=paths=source_relative sync.proto
