package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// connectConfig is the pre-CONNECT workload: connections that never send a
// CONNECT, then connections that announce a large CONNECT and stall.
type connectConfig struct {
	Addr    string
	PID     int
	Metrics string        // the broker's Prometheus /metrics URL, for its Go heap; empty: not read
	Silent  int           // connections that send nothing
	Big     int           // connections that announce BigSize bytes of CONNECT and send 10 bytes
	BigSize int           // announced remaining length of their CONNECT
	Settle  time.Duration // wait after opening a batch before reading RSS
	Hold    time.Duration // wait after opening a batch before counting what is still open
}

// connectResult is the JSON line connectCmd prints; RSS in MB.
type connectResult struct {
	Label             string  `json:"label"`
	RSSIdleMB         float64 `json:"rss_idle_mb"`
	HeapIdleMB        float64 `json:"heap_idle_mb"`
	HeapSilentMB      float64 `json:"heap_silent_mb"`
	HeapBigMB         float64 `json:"heap_big_mb"`
	Silent            int     `json:"silent"`
	SilentOpened      int     `json:"silent_opened"`
	RSSSilentMB       float64 `json:"rss_silent_mb"`
	SilentOpenAtHold  int     `json:"silent_open_after_hold"`
	RSSSilentHoldMB   float64 `json:"rss_silent_hold_mb"`
	Big               int     `json:"big"`
	BigOpened         int     `json:"big_opened"`
	RSSBigMB          float64 `json:"rss_big_mb"`
	BigOpenAtHold     int     `json:"big_open_after_hold"`
	RSSBigHoldMB      float64 `json:"rss_big_hold_mb"`
	RSSPeakMB         float64 `json:"rss_peak_mb"`
	HoldSeconds       float64 `json:"hold_s"`
	SettleSeconds     float64 `json:"settle_s"`
	AnnouncedConnectB int     `json:"announced_connect_bytes"`
	// Closed is peat_mqtt_closed_connections_total by reason at the end
	// (empty for a broker without it).
	Closed map[string]float64 `json:"closed"`
}

func connectCmd(args []string) error {
	fs := flag.NewFlagSet("connect", flag.ExitOnError)
	var cfg connectConfig
	var label string
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:1883", "broker address")
	fs.IntVar(&cfg.PID, "pid", 0, "broker process id, to read its RSS")
	fs.StringVar(&cfg.Metrics, "metrics", "", "broker's /metrics URL, to read go_memstats_heap_inuse_bytes")
	fs.IntVar(&cfg.Silent, "silent", 5000, "connections that send nothing")
	fs.IntVar(&cfg.Big, "big", 300, "connections that announce a large CONNECT and send 10 bytes")
	fs.IntVar(&cfg.BigSize, "big-size", 1<<20, "announced CONNECT remaining length")
	fs.DurationVar(&cfg.Settle, "settle", 2*time.Second, "wait after a batch is open before reading RSS")
	fs.DurationVar(&cfg.Hold, "hold", 8*time.Second, "wait after a batch is open before counting what the broker kept open")
	fs.StringVar(&label, "label", "", "system under test, copied into the output")
	_ = fs.Parse(args)
	if cfg.PID <= 0 {
		return fmt.Errorf("connect: --pid is required")
	}
	res, err := runConnect(cfg)
	if err != nil {
		return err
	}
	res.Label = label
	return json.NewEncoder(os.Stdout).Encode(res)
}

func runConnect(cfg connectConfig) (connectResult, error) {
	res := connectResult{Silent: cfg.Silent, Big: cfg.Big, AnnouncedConnectB: cfg.BigSize,
		HoldSeconds: cfg.Hold.Seconds(), SettleSeconds: cfg.Settle.Seconds()}
	rss := func() float64 {
		st, _ := readProc(cfg.PID)
		return float64(st.rss) / (1 << 20)
	}
	heap := func() float64 {
		v, ok := scrape(cfg.Metrics)["go_memstats_heap_inuse_bytes"]
		if !ok {
			return -1
		}
		return v / (1 << 20)
	}
	res.RSSIdleMB, res.HeapIdleMB = rss(), heap()

	silent := openBatch(cfg.Addr, cfg.Silent, nil)
	res.SilentOpened = silent.opened()
	time.Sleep(cfg.Settle)
	res.RSSSilentMB, res.HeapSilentMB = rss(), heap()
	time.Sleep(cfg.Hold - cfg.Settle)
	res.SilentOpenAtHold = silent.open()
	res.RSSSilentHoldMB = rss()
	silent.close()

	// 10 bytes: CONNECT, a 3-byte remaining length, and the protocol
	// name's length and first letters; the rest never comes. MQTT's
	// remaining length is Go's uvarint.
	head := append([]byte{0x10}, binary.AppendUvarint(nil, uint64(cfg.BigSize))...)
	head = append(head, 0, 4, 'M', 'Q', 'T', 'T')
	big := openBatch(cfg.Addr, cfg.Big, head[:min(len(head), 10)])
	res.BigOpened = big.opened()
	time.Sleep(cfg.Settle)
	res.RSSBigMB, res.HeapBigMB = rss(), heap()
	time.Sleep(cfg.Hold - cfg.Settle)
	res.BigOpenAtHold = big.open()
	res.RSSBigHoldMB = rss()
	big.close()

	st, _ := readProc(cfg.PID)
	res.RSSPeakMB = float64(st.hwm) / (1 << 20)
	res.Closed = map[string]float64{}
	for k, v := range scrape(cfg.Metrics) {
		if reason, ok := strings.CutPrefix(k, `peat_mqtt_closed_connections_total{reason="`); ok && v > 0 {
			res.Closed[strings.TrimSuffix(reason, `"}`)] = v
		}
	}
	return res, nil
}

// scrape reads the samples of a Prometheus text endpoint, by series
// (name and labels as written); nil when it cannot.
func scrape(url string) map[string]float64 {
	if url == "" {
		return nil
	}
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// connBatch is a set of connections, each watched by a reader goroutine
// that notes when the broker closes it.
type connBatch struct {
	conns  []net.Conn
	closed atomic.Int64 // connections the broker closed
	wg     sync.WaitGroup
}

// openBatch opens n connections to addr and writes first on each.
func openBatch(addr string, n int, first []byte) *connBatch {
	b := &connBatch{}
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue // refused at the TCP level: counts as not opened
		}
		if len(first) > 0 {
			_, _ = c.Write(first)
		}
		b.conns = append(b.conns, c)
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			buf := make([]byte, 64)
			for {
				if _, err := c.Read(buf); err != nil {
					b.closed.Add(1)
					return
				}
			}
		}()
	}
	return b
}

func (b *connBatch) opened() int { return len(b.conns) }

// open is how many connections the broker has not closed.
func (b *connBatch) open() int { return len(b.conns) - int(b.closed.Load()) }

// close closes every connection and waits for the readers.
func (b *connBatch) close() {
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.wg.Wait()
}
