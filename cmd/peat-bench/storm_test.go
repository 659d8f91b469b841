package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/peatmq/peat/edge"
)

// The storm workload logs its users in against a node with a users file,
// and reports the connected clients' ping latency for each round.
func TestStorm_LogsInAndMeasures(t *testing.T) {
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	if err := stormUsersCmd([]string{"-file", users, "-n", "12"}); err != nil {
		t.Fatal(err)
	}
	cfg := edge.DefaultConfig()
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.MQTT.Listen, cfg.HTTP.Listen = "127.0.0.1:0", ""
	cfg.Storage.Profile = "server"
	cfg.Auth.UsersFile = users
	n, err := edge.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	}()
	res, err := runStorm(stormConfig{Addr: n.MQTTAddr().String(), Prefix: "sensor-", Clients: 10, Watchers: 2,
		Rounds: 2, Ping: 5 * time.Millisecond, Quiet: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(res.Rounds))
	}
	for i, r := range res.Rounds {
		if r.Refused != 0 || r.PingMax <= 0 {
			t.Errorf("round %d: %+v: want every client in and pings measured", i, r)
		}
	}
	// A wrong password is refused: the workload is not an open door.
	bad := stormConfig{Addr: n.MQTTAddr().String(), Prefix: "nobody-", Clients: 1, Watchers: 0, Rounds: 1}
	if res, err := runStorm(bad); err != nil || res.Rounds[0].Refused != 1 {
		t.Errorf("unknown users: %+v, %v; want the one client refused", res, err)
	}
	_ = os.Remove(users)
}
