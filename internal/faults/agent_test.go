package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ration-dev/ration/internal/cutproxy"
	"github.com/ration-dev/ration/lease/agent"
)

// TestFaultAgentKilled: eu's gateway dies holding leases. Its agent
// reaches regiond through a proxy; at the kill the gateway stops
// admitting, the proxy is cut (so the agent's unused tokens never go
// back: what a dead process's leases do) and the agent is closed; a new
// gateway process, with a new agent, takes the load at once.
func TestFaultAgentKilled(t *testing.T) {
	needFaults(t)
	w := newWorld(t, nil, nil)
	for _, r := range regions {
		w.startDaemon(r, r+"-0")
	}
	p := cutproxy.Start(t, w.daemons["eu"][0].LeaseAddr())
	w.gws["eu"] = w.startGateway("eu", agent.Config{Target: p.Addr()})
	w.startRegions()
	w.steady()

	began := time.Now()
	old := w.gws["eu"].swap(nil)
	p.Cut()
	_ = old.Close()
	t.Logf("the killed agent held leases; closing it without the region took %v", time.Since(began).Round(time.Millisecond))
	w.gws["eu"].swap(w.newAgent(w.gws["eu"], agent.Config{Target: w.daemons["eu"][0].LeaseAddr(), AgentID: "gateway-eu-2"}))
	w.row("agent-killed", began, began)
}

// clockStep is how far TestFaultAgentClockStep steps an agent's clock.
const clockStep = 5 * time.Second

// TestFaultAgentClockStep: eu's agent's clock jumps clockStep ahead, runs
// so for a while, then jumps back by as much (the step an NTP correction
// makes), both while it holds leases. The agent's Clock dates its leases
// and deny cache: ahead, its leases look expired; back, they look young.
func TestFaultAgentClockStep(t *testing.T) {
	needFaults(t)
	w := newWorld(t, nil, nil)
	w.startRegions()
	w.steady()
	g := w.gws["eu"]
	began := time.Now()
	g.clock.Add(int64(clockStep))
	w.run(3 * time.Second)
	ended := time.Now()
	g.clock.Add(-int64(clockStep))
	before := g.agent().Stats()
	w.row("agent-clock-step", began, ended)
	logPaths(t, "from the step back to the row's end", before, g.agent().Stats())
}

// logPaths logs an agent's decisions between two Stats, by path.
func logPaths(t *testing.T, what string, a, b agent.Stats) {
	t.Helper()
	var line []string
	for p := range agent.PathShadow + 1 {
		allowed, denied := b.Decisions[p][1]-a.Decisions[p][1], b.Decisions[p][0]-a.Decisions[p][0]
		if allowed+denied > 0 {
			line = append(line, fmt.Sprintf("%v %d allowed %d denied", p, allowed, denied))
		}
	}
	t.Logf("eu's agent %s: %s", what, strings.Join(line, ", "))
}
