// Package leasev1 holds the generated code of the lease API (lease.proto):
// the gRPC service between gateway agents and their region's regiond.
package leasev1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative lease.proto
