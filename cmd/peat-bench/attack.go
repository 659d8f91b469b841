package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peatmq/peat/mqtt/mqtttest/rawmqtt"
)

// The attack: one address on the LAN guesses a user's password over
// several connections at once and holds silent sockets (connected, no
// CONNECT), while legitimate sensors from another address keep
// reconnecting with their right passwords. What a site notices is the
// sensors' connect latency and whether they get in at all; what the
// attacker gets is guesses per second.

// attackConfig is the workload. Users are <prefix><i> with password
// pw-<i> (stormUsersCmd writes them); the attacker guesses <prefix>0's.
type attackConfig struct {
	Addr     string
	Prefix   string
	Legit    int           // sensors reconnecting in a loop, users <prefix>1 and up
	Pause    time.Duration // between a sensor's reconnects
	Guessers int           // the attacker's parallel guessing connections
	Silent   int           // the attacker's silent sockets, reopened when closed
	Phase    time.Duration // how long the baseline and the attack each last
	Attacker string        // the attacker's source IP
	Sensors  string        // the sensors' source IP
}

// attackPhase is the sensors' connect latency over one phase, in ms.
type attackPhase struct {
	Connects int     `json:"connects"`
	Failed   int     `json:"failed"` // attempts refused or closed before a CONNACK
	P50      float64 `json:"connect_p50_ms"`
	P99      float64 `json:"connect_p99_ms"`
	Max      float64 `json:"connect_max_ms"`
}

// attackResult is the JSON line attackCmd prints.
type attackResult struct {
	Label       string      `json:"label"`
	Baseline    attackPhase `json:"baseline"`
	Attack      attackPhase `json:"attack"`
	Guesses     int64       `json:"guesses_answered"`  // wrong passwords answered 0x86 / 4
	Throttled   int64       `json:"guesses_throttled"` // answered 0x9F / 3 without a check
	GuessErrors int64       `json:"guesses_closed"`    // closed before any CONNACK
	GuessRate   float64     `json:"guesses_per_s"`
	Per1000     float64     `json:"s_per_1000_guesses"`
	SilentOpen  float64     `json:"silent_open_avg"` // silent sockets the broker held, on average
}

func attackCmd(args []string) error {
	fs := flag.NewFlagSet("attack", flag.ExitOnError)
	var cfg attackConfig
	var label string
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:1883", "broker address")
	fs.StringVar(&cfg.Prefix, "prefix", "sensor-", "user names are PREFIX<i>, passwords pw-<i> (peat-bench storm-users writes them)")
	fs.IntVar(&cfg.Legit, "sensors", 10, "sensors reconnecting in a loop")
	fs.DurationVar(&cfg.Pause, "pause", 50*time.Millisecond, "between a sensor's reconnects")
	fs.IntVar(&cfg.Guessers, "guessers", 8, "attacker's parallel guessing connections")
	fs.IntVar(&cfg.Silent, "silent", 300, "attacker's silent sockets")
	fs.DurationVar(&cfg.Phase, "phase", 10*time.Second, "length of the baseline and of the attack")
	fs.StringVar(&cfg.Attacker, "attacker", "127.0.0.2", "attacker's source IP")
	fs.StringVar(&cfg.Sensors, "from", "127.0.0.1", "sensors' source IP")
	fs.StringVar(&label, "label", "", "system under test, copied into the output")
	_ = fs.Parse(args)
	res := runAttack(cfg)
	res.Label = label
	return json.NewEncoder(os.Stdout).Encode(res)
}

func runAttack(cfg attackConfig) *attackResult {
	res := &attackResult{}
	res.Baseline = sensorsPhase(cfg)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var open atomic.Int64
	for range cfg.Silent {
		wg.Go(func() { holdSilent(cfg, stop, &open) })
	}
	start := time.Now()
	for range cfg.Guessers {
		wg.Go(func() { guess(cfg, stop, res) })
	}
	var openSum, openN float64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				openSum += float64(open.Load())
				openN++
			}
		}
	}()
	time.Sleep(time.Second) // the attack takes hold
	res.Attack = sensorsPhase(cfg)
	close(stop)
	elapsed := time.Since(start)
	wg.Wait()
	<-sampled
	if openN > 0 {
		res.SilentOpen = round(openSum / openN)
	}
	n := atomic.LoadInt64(&res.Guesses)
	res.GuessRate = round(float64(n) / elapsed.Seconds())
	if n > 0 {
		res.Per1000 = round(1000 * elapsed.Seconds() / float64(n))
	}
	return res
}

// sensorsPhase reconnects the sensors for cfg.Phase and times each CONNACK.
func sensorsPhase(cfg attackConfig) attackPhase {
	var mu sync.Mutex
	lat := newSamples()
	failed := 0
	end := time.Now().Add(cfg.Phase)
	var wg sync.WaitGroup
	for i := range cfg.Legit {
		wg.Go(func() {
			o := dialOptions{clean: true, keepalive: 60, readBuf: 512, local: cfg.Sensors}
			o.user, o.password = fmt.Sprintf("%s%d", cfg.Prefix, i+1), fmt.Sprintf("pw-%d", i+1)
			for time.Now().Before(end) {
				t0 := time.Now()
				c, err := dial(cfg.Addr, fmt.Sprintf("sensor-%d", i+1), o)
				d := time.Since(t0)
				mu.Lock()
				if err != nil {
					failed++
				} else {
					lat.add(int64(d))
				}
				mu.Unlock()
				if c != nil {
					c.Close()
				}
				time.Sleep(cfg.Pause)
			}
		})
	}
	wg.Wait()
	return attackPhase{Connects: len(lat.v), Failed: failed,
		P50: round(lat.quantile(0.5)), P99: round(lat.quantile(0.99)), Max: round(lat.quantile(1))}
}

// holdSilent keeps one silent socket open from the attacker's address,
// opening a new one whenever the broker closes it.
func holdSilent(cfg attackConfig, stop <-chan struct{}, open *atomic.Int64) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(cfg.Attacker)}, Timeout: 5 * time.Second}
	buf := make([]byte, 64)
	for {
		select {
		case <-stop:
			return
		default:
		}
		nc, err := d.Dial("tcp", cfg.Addr)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		open.Add(1)
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			for {
				if _, err := nc.Read(buf); err != nil {
					return
				}
			}
		}()
		select {
		case <-closed:
		case <-stop:
		}
		open.Add(-1)
		nc.Close()
		<-closed
	}
}

// guess logs in as <prefix>0 with wrong passwords, one after another.
func guess(cfg attackConfig, stop <-chan struct{}, res *attackResult) {
	o := dialOptions{clean: true, keepalive: 60, readBuf: 512, local: cfg.Attacker, user: cfg.Prefix + "0"}
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		o.password = fmt.Sprintf("guess-%d", i)
		c, err := dial(cfg.Addr, "guesser", o)
		var refused *rawmqtt.RefusedError
		switch {
		case err == nil:
			c.Close() // a lucky guess: not with these passwords
		case errors.As(err, &refused) && (refused.Code == 0x9f || refused.Code == 0x3): // connection rate exceeded, server unavailable
			atomic.AddInt64(&res.Throttled, 1)
		case errors.Is(err, rawmqtt.ErrRefused):
			atomic.AddInt64(&res.Guesses, 1)
		default:
			atomic.AddInt64(&res.GuessErrors, 1)
			time.Sleep(10 * time.Millisecond)
		}
	}
}
