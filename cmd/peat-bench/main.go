// Command peat-bench is Peat's load generator: a minimal MQTT client
// (mqtt/mqtttest/rawmqtt, the repository's one raw client) that writes
// one PUBLISH per write like a real sensor, counts loss and
// duplicates exactly, and prints one JSON line per run. `peat-bench mochi`
// runs plain mochi (no persistence, allow-all) as the peer to compare with.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "fanin":
		err = faninCmd(os.Args[2:])
	case "sensors":
		err = sensorsCmd(os.Args[2:])
	case "replay":
		err = replayCmd(os.Args[2:])
	case "mochi":
		err = mochiCmd(os.Args[2:])
	case "fsync":
		err = fsyncCmd(os.Args[2:])
	case "connect":
		err = connectCmd(os.Args[2:])
	case "storm":
		err = stormCmd(os.Args[2:])
	case "storm-users":
		err = stormUsersCmd(os.Args[2:])
	case "attack":
		err = attackCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peat-bench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  peat-bench fanin [flags]   run a fan-in workload against --addr, print one JSON line
  peat-bench sensors [flags] run many staggered low-rate publishers against --addr, print one JSON line
  peat-bench replay [flags]  fill the log, then replay it through $replay/<from>/+/<filter>, print one JSON line
  peat-bench mochi [flags]   run plain mochi (allow-all, no persistence) on --listen
  peat-bench fsync [flags]   append small blocks to a file in --dir, fdatasync each, print one JSON line
  peat-bench connect [flags] open connections that never send a (whole) CONNECT to --addr, print the broker's RSS as one JSON line
  peat-bench storm [flags]   reconnect --clients users with hashed passwords at once, print connected clients' PINGRESP latency as one JSON line
  peat-bench storm-users [flags] write the users file storm logs in with
  peat-bench attack [flags]  sensors reconnect while one address guesses a password and holds silent sockets; one JSON line`)
	os.Exit(2)
}

func faninCmd(args []string) error {
	fs := flag.NewFlagSet("fanin", flag.ExitOnError)
	cfg := faninConfig{}
	var qos, pid int
	var label, others string
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:1883", "broker address")
	fs.IntVar(&cfg.Publishers, "publishers", 10, "publishing connections")
	fs.IntVar(&cfg.Subscribers, "subscribers", 1, "subscribers of bench/#")
	fs.IntVar(&qos, "qos", 1, "QoS of publishes and subscriptions (0 or 1)")
	fs.IntVar(&cfg.Window, "window", 16, "QoS 1 publishes in flight per publisher")
	fs.IntVar(&cfg.Payload, "payload", 128, "payload bytes")
	fs.IntVar(&cfg.Rate, "rate", 0, "total offered msg/s; 0 = unthrottled")
	fs.IntVar(&cfg.Count, "count", 20000, "messages per publisher")
	fs.DurationVar(&cfg.Drain, "drain", 3*time.Second, "how long subscribers may stay silent before the rest counts as lost")
	fs.IntVar(&pid, "pid", 0, "broker process id, to report its CPU time per message and RSS")
	fs.StringVar(&others, "other-pids", "", "comma-separated ids of the system's other processes (a site's other nodes): with --pid, all_cpu_us_per_msg counts them too")
	fs.StringVar(&label, "label", "", "system under test, copied into the output")
	_ = fs.Parse(args)
	cfg.QoS = byte(qos)
	rest, err := parsePIDs(others)
	if err != nil {
		return fmt.Errorf("--other-pids: %w", err)
	}

	before, _ := readProc(pid)
	restBefore := cpuOf(rest)
	res, err := runFanin(cfg)
	if err != nil {
		return err
	}
	after, _ := readProc(pid)
	restCPU := cpuOf(rest) - restBefore
	secs := res.Elapsed.Seconds()
	out := map[string]any{
		"label": label, "workload": "fanin", "publishers": cfg.Publishers, "subscribers": cfg.Subscribers,
		"qos": cfg.QoS, "window": cfg.Window, "payload": cfg.Payload, "rate": cfg.Rate,
		"sent": res.Sent, "acked": res.Acked, "received": res.Received, "lost": res.Lost, "dups": res.Dups,
		"seconds":         round(secs),
		"delivered_per_s": round(float64(res.Received) / secs),
		"acked_per_s":     round(float64(res.Acked) / secs),
		"offered_per_s":   round(float64(res.Sent) / res.Publishing.Seconds()),
		"puback_p50_ms":   round(res.Puback.quantile(0.5)), "puback_p99_ms": round(res.Puback.quantile(0.99)),
		"puback_p999_ms": round(res.Puback.quantile(0.999)),
		"e2e_p50_ms":     round(res.E2E.quantile(0.5)), "e2e_p99_ms": round(res.E2E.quantile(0.99)),
		"e2e_p999_ms": round(res.E2E.quantile(0.999)),
	}
	// CPU per message the broker handled: per delivery when there are
	// subscribers, else per publish it took (acked at QoS 1).
	handled := res.Received
	if cfg.Subscribers == 0 {
		handled = res.Sent
		if cfg.QoS > 0 {
			handled = res.Acked
		}
	}
	if pid > 0 && handled > 0 {
		out["cpu_us_per_msg"] = round(float64(after.cpu-before.cpu) / float64(time.Microsecond) / float64(handled))
		out["all_cpu_us_per_msg"] = round(float64(after.cpu-before.cpu+restCPU) / float64(time.Microsecond) / float64(handled))
		out["rss_idle_mb"] = round(float64(before.rss) / (1 << 20)) // before the run's connections
		out["rss_mb"] = round(float64(after.rss) / (1 << 20))
		out["rss_peak_mb"] = round(float64(after.hwm) / (1 << 20))
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

func mochiCmd(args []string) error {
	fs := flag.NewFlagSet("mochi", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:1883", "MQTT listen address")
	_ = fs.Parse(args)
	srv := mochi.New(&mochi.Options{InlineClient: false})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return err
	}
	if err := srv.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: *listen})); err != nil {
		return err
	}
	if err := srv.Serve(); err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	return srv.Close()
}
