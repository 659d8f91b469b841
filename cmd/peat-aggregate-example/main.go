// Command peat-aggregate-example keeps per-topic aggregates (count, sum,
// min, max) of numeric MQTT payloads in SQLite, with exactly-once results
// and no consumer state in the broker.
//
// The pattern comes from Kafka's design: a consumer that writes its results
// to its own database stores the offset of the last record it applied in
// the same transaction as the results. A crash at any point keeps both or
// neither, so on restart the stored offset tells exactly where the results
// stop, and the consumer asks Peat for the records after it:
//
//	$replay/<stored offset + 1>/+/<filter>     (earliest for a new database)
//
// Peat delivers each record as $replay/<from>/<offset>/<original topic>,
// so the offset travels with the record. Records that arrive twice (a
// redelivery, an overlap) are at or below the stored offset and are skipped.
// No group, no session, no acknowledgement matters for correctness: the
// position lives next to the results, where one transaction covers both.
//
// Usage:
//
//	peat-aggregate-example [--broker 127.0.0.1:1883] [--db aggregates.db] 'sensors/#'
//	sqlite3 aggregates.db 'SELECT * FROM aggregates'
//
// It runs until interrupted, and exits non-zero when the connection is lost;
// run it under a supervisor (systemd Restart=always) and it resumes where
// it stopped.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

func main() {
	broker := flag.String("broker", "127.0.0.1:1883", "MQTT address of a Peat node")
	dbPath := flag.String("db", "aggregates.db", "SQLite database holding the aggregates and the position")
	clientID := flag.String("client-id", fmt.Sprintf("peat-aggregate-%d", os.Getpid()), "MQTT client id")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: %s [flags] FILTER\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *broker, *dbPath, *clientID, flag.Arg(0)); err != nil {
		log.Printf("peat-aggregate-example: %v", err)
		os.Exit(1)
	}
}

// run consumes until ctx is done (a clean stop), the connection is lost or
// the database fails.
func run(ctx context.Context, broker, dbPath, clientID, filter string) error {
	store, err := OpenStore(dbPath, filter)
	if err != nil {
		return err
	}
	defer store.Close()

	conn, err := net.DialTimeout("tcp", broker, 10*time.Second)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", broker, err)
	}
	failed := make(chan error, 1) // the first failure stops run
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	var stopped bool // set by apply: after a failure nothing more is applied, or it would leave a gap
	apply := func(pr paho.PublishReceived) (bool, error) {
		if stopped {
			return true, nil
		}
		parts := strings.SplitN(pr.Packet.Topic, "/", 4) // $replay/<from>/<offset>/<topic>
		if len(parts) != 4 {
			stopped = true
			fail(fmt.Errorf("delivery on %q has no offset level", pr.Packet.Topic))
			return true, nil
		}
		offset, err := strconv.ParseInt(parts[2], 10, 64)
		if err == nil {
			err = store.Apply(ctx, offset, parts[3], pr.Packet.Payload)
		}
		switch {
		case errors.Is(err, ErrNotNumber):
			log.Printf("skipped: %v", err) // applied: only the position moved
		case err != nil:
			stopped = true
			fail(err)
		}
		return true, nil
	}
	c := paho.NewClient(paho.ClientConfig{
		ClientID:          clientID,
		Conn:              conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){apply},
		OnClientError:     func(err error) { fail(fmt.Errorf("connection lost: %w", err)) },
		OnServerDisconnect: func(d *paho.Disconnect) {
			fail(fmt.Errorf("broker disconnected, reason code 0x%02x", d.ReasonCode))
		},
	})
	window := uint16(100) // records in flight to us; bounds what a restart asks for again
	if _, err := c.Connect(ctx, &paho.Connect{
		ClientID: clientID, CleanStart: true, KeepAlive: 30,
		// Without RequestProblemInfo the broker leaves reasons out of its SUBACK.
		Properties: &paho.ConnectProperties{ReceiveMaximum: &window, RequestProblemInfo: true},
	}); err != nil {
		conn.Close()
		return fmt.Errorf("connect to %s: %w", broker, err)
	}
	defer c.Disconnect(&paho.Disconnect{ReasonCode: 0})

	topic := "$replay/" + store.Resume() + "/+/" + filter
	sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}})
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", topic, err) // paho's error carries the broker's reason
	}
	if notice := sa.Properties.User.Get("notice"); notice != "" {
		log.Printf("broker notice: %s", notice) // e.g. the stored offset fell below retention
	}
	log.Printf("subscribed to %s", topic)

	select {
	case <-ctx.Done():
		return nil
	case err := <-failed:
		return err
	}
}
