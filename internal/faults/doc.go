// Package faults is the fault matrix (issue 18): one test per fault, each
// on real components that the test starts — three regions, each a regiond
// on its own redis-server, exchanging over embedded NATS, with one gateway
// agent per region under steady skewed load on one global key — and each
// reporting one row:
//
//	fault=<name> ratio=<admitted ÷ (L·W + B), the worst window that meets the fault> recovery=<duration>
//
// The package has no code of its own beyond this comment. The fault tests
// (TestFault*) skip unless RATION_FAULTS=1, which `make faults` sets before
// it prints the table; TestWorstWindow, the rows' arithmetic, always runs. docs/DESIGN.md ("The bound") states the bound the ratio divides
// by.
package faults
