package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/peatmq/peat/edge/auth"
	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
)

// The reconnect storm: a site's sensors all come back at once after an
// outage, each logging in with its own hashed password, while a few
// clients that stayed connected measure how long the broker takes to
// answer their PINGREQs. Password hashing is the cost: a broker that
// hashes on every core at once starves the connected clients.

// stormConfig is the workload. Users are <prefix><i> with password
// pw-<i>, i from 0 (stormUsersCmd writes that users file).
type stormConfig struct {
	Addr     string
	Prefix   string
	Clients  int           // reconnecting clients per round
	Watchers int           // connected clients measuring PINGRESP latency
	Rounds   int           // storms, one after another (the first meets a cold verification cache)
	Ping     time.Duration // between a watcher's PINGREQs
	Quiet    time.Duration // watchers measure this long before the first storm (the baseline)
	PID      int
}

// stormGiveUp is how long a refused sensor keeps trying in one round.
const stormGiveUp = time.Minute

// stormRound is one storm: how long until every client had its CONNACK,
// and the watchers' PINGRESP latency meanwhile, in ms.
type stormRound struct {
	ConnectAllSeconds float64 `json:"connect_all_s"`
	Refused           int     `json:"refused"`     // connection attempts refused (each retried)
	Unconnected       int     `json:"unconnected"` // sensors still without a CONNACK when they gave up
	PingP50           float64 `json:"ping_p50_ms"`
	PingP99           float64 `json:"ping_p99_ms"`
	PingMax           float64 `json:"ping_max_ms"`
}

// stormResult is the JSON line stormCmd prints.
type stormResult struct {
	Label       string       `json:"label"`
	Clients     int          `json:"clients"`
	Watchers    int          `json:"watchers"`
	BaselineP99 float64      `json:"baseline_ping_p99_ms"`
	Rounds      []stormRound `json:"rounds"`
	CPUSeconds  float64      `json:"broker_cpu_s,omitempty"`
}

func stormCmd(args []string) error {
	fs := flag.NewFlagSet("storm", flag.ExitOnError)
	var cfg stormConfig
	var label string
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:1883", "broker address")
	fs.StringVar(&cfg.Prefix, "prefix", "sensor-", "user names are PREFIX<i>, passwords pw-<i> (peat-bench storm-users writes them)")
	fs.IntVar(&cfg.Clients, "clients", 1000, "clients reconnecting at once")
	fs.IntVar(&cfg.Watchers, "watchers", 10, "connected clients measuring PINGRESP latency (users PREFIX<clients> and up)")
	fs.IntVar(&cfg.Rounds, "rounds", 2, "storms in a row")
	fs.DurationVar(&cfg.Ping, "ping", 20*time.Millisecond, "between a watcher's PINGREQs")
	fs.DurationVar(&cfg.Quiet, "quiet", 2*time.Second, "baseline measured before the first storm")
	fs.IntVar(&cfg.PID, "pid", 0, "broker process id, to report its CPU time")
	fs.StringVar(&label, "label", "", "system under test, copied into the output")
	_ = fs.Parse(args)
	before, _ := readProc(cfg.PID)
	res, err := runStorm(cfg)
	if err != nil {
		return err
	}
	res.Label = label
	if after, err := readProc(cfg.PID); err == nil && cfg.PID > 0 {
		res.CPUSeconds = round(after.cpu.Seconds() - before.cpu.Seconds())
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// stormUsersCmd writes a users file for n users PREFIX<i> with password
// pw-<i>, argon2id as `peat passwd` writes them.
func stormUsersCmd(args []string) error {
	fs := flag.NewFlagSet("storm-users", flag.ExitOnError)
	file := fs.String("file", "users", "users file to write")
	prefix := fs.String("prefix", "sensor-", "user name prefix")
	n := fs.Int("n", 1010, "users")
	_ = fs.Parse(args)
	f, err := os.Create(*file)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for i := range *n {
		h, err := auth.HashPassword(fmt.Sprintf("pw-%d", i))
		if err != nil {
			f.Close()
			return err
		}
		fmt.Fprintf(w, "%s%d:%s\n", *prefix, i, h)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func stormLogin(cfg stormConfig, i int) dialOptions {
	o := dialOptions{clean: true, keepalive: 60, readBuf: 512}
	o.user, o.password = fmt.Sprintf("%s%d", cfg.Prefix, i), fmt.Sprintf("pw-%d", i)
	return o
}

// watcher pings the broker and records each round trip.
type watcher struct {
	c    *conn
	mu   sync.Mutex
	lat  *samples
	stop chan struct{}
	done chan struct{}
}

func (w *watcher) run(every time.Duration) {
	defer close(w.done)
	ping := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Pingreq}}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		start := time.Now()
		_ = w.c.NetConn().SetReadDeadline(start.Add(time.Minute)) // a broker that never answers ends the watcher
		if err := w.c.write(&ping); err != nil {
			return
		}
		for {
			pk, err := w.c.read()
			if err != nil {
				return
			}
			if pk.FixedHeader.Type == packets.Pingresp {
				break
			}
		}
		w.mu.Lock()
		w.lat.add(int64(time.Since(start)))
		w.mu.Unlock()
	}
}

// take returns the samples so far and starts new ones.
func (w *watcher) take() *samples {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.lat
	w.lat = newSamples()
	return s
}

func runStorm(cfg stormConfig) (*stormResult, error) {
	res := &stormResult{Clients: cfg.Clients, Watchers: cfg.Watchers}
	var ws []*watcher
	defer func() {
		for _, w := range ws {
			close(w.stop)
			<-w.done // then the connection is the closer's alone
			w.c.close()
		}
	}()
	for i := range cfg.Watchers {
		c, err := dial(cfg.Addr, fmt.Sprintf("storm-watch-%d", i), stormLogin(cfg, cfg.Clients+i))
		if err != nil {
			return nil, err
		}
		w := &watcher{c: c, lat: newSamples(), stop: make(chan struct{}), done: make(chan struct{})}
		ws = append(ws, w)
		go w.run(cfg.Ping)
	}
	collect := func() *samples {
		all := newSamples()
		for _, w := range ws {
			all.merge(w.take())
		}
		return all
	}
	time.Sleep(cfg.Quiet)
	res.BaselineP99 = round(collect().quantile(0.99))
	for range cfg.Rounds {
		var refused atomic.Int64
		var wg sync.WaitGroup
		conns := make([]*conn, cfg.Clients)
		start := time.Now()
		for i := range cfg.Clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// A refused sensor tries again, as real ones do, after a
				// growing pause with jitter (the broker closes connections
				// beyond mqtt.max_pending_connections at once).
				for attempt := 0; ; attempt++ {
					c, err := dial(cfg.Addr, fmt.Sprintf("storm-%d", i), stormLogin(cfg, i))
					if err == nil {
						conns[i] = c
						return
					}
					refused.Add(1)
					if errors.Is(err, rawmqtt.ErrRefused) || time.Since(start) > stormGiveUp {
						return // its login is refused, or the broker never let it in
					}
					pause := min(time.Duration(50<<min(attempt, 5))*time.Millisecond, 2*time.Second)
					time.Sleep(pause/2 + time.Duration(rand.Int64N(int64(pause/2)+1)))
				}
			}()
		}
		wg.Wait()
		took := time.Since(start)
		time.Sleep(2 * cfg.Ping) // a ping held up by the storm is answered and counted
		lat := collect()
		res.Rounds = append(res.Rounds, stormRound{
			ConnectAllSeconds: round(took.Seconds()), Refused: int(refused.Load()), Unconnected: unconnected(conns),
			PingP50: round(lat.quantile(0.5)), PingP99: round(lat.quantile(0.99)), PingMax: round(lat.quantile(1)),
		})
		for _, c := range conns {
			if c != nil {
				c.close()
			}
		}
		time.Sleep(cfg.Quiet) // the broker lets the connections go
		collect()
	}
	return res, nil
}

func unconnected(conns []*conn) int {
	n := 0
	for _, c := range conns {
		if c == nil {
			n++
		}
	}
	return n
}
