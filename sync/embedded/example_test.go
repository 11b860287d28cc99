package embedded_test

import (
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ration-dev/ration/sync/embedded"
)

// A three-server cluster where region eu may publish only its own reports
// and receive every region's. Give the client every server's URL so that
// it fails over when its server goes away.
func ExampleStartCluster() {
	var users []embedded.User
	for _, r := range []string{"us", "eu", "ap"} {
		users = append(users, embedded.RegionUser("ration.sync", r, r+"-secret"))
	}
	c, err := embedded.StartCluster(embedded.ClusterConfig{Name: "demo", Size: 3, Server: embedded.Config{Users: users}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	nc, err := nats.Connect(strings.Join(c.ClientURLs(), ","), nats.UserInfo("eu", "eu-secret"), nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("ration.sync.>")
	if err != nil {
		log.Fatal(err)
	}
	if err := nc.Publish("ration.sync.eu", []byte("eu's report")); err != nil {
		log.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d servers; %s on %s\n", c.Name(), len(c.Servers()), m.Data, m.Subject)
	// Output: demo: 3 servers; eu's report on ration.sync.eu
}
