package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/peatmq/peat/edge/status"
)

// The operator's commands (status, streams, groups, check) read a node's
// HTTP API; they never touch its data directory, so they work against a
// node on another host and while it runs.

// exitUnknown is what status, streams, groups and check exit with when
// the node cannot be asked (Nagios' UNKNOWN).
const exitUnknown = 3

// exitAlarm is what `peat status` exits with while an alarm is active.
const exitAlarm = 1

// defaultNodeHTTP is where the operator's commands look without --http or
// PEAT_HTTP: the address `peat serve` listens on by default.
const defaultNodeHTTP = "127.0.0.1:8080"

const statusUsage = `Usage: peat status [flags]

Prints a summary of a running node: version and uptime, clients, rates
over the last minute, streams, consumer groups and their lag, durable
sessions, disk space against the reserve, and active alarms.

Exit status: 0 without alarms, 1 while an alarm is active, 2 for bad
flags, 3 when the node cannot be asked.

Flags:
`

const streamsUsage = `Usage: peat streams [flags]

Lists a running node's streams: offsets, records, size, the oldest
record's age and retention.

Exit status: 0, 2 for bad flags, 3 when the node cannot be asked.

Flags:
`

const groupsUsage = `Usage: peat groups [flags]

Lists a running node's consumer groups: committed offset, lag in records
and in time (the age of the oldest record not consumed), and the active
consumer.

Exit status: 0, 2 for bad flags, 3 when the node cannot be asked.

Flags:
`

// opsOptions are the flags the operator's commands share.
type opsOptions struct {
	http    string
	output  string
	timeout time.Duration
	// token and cafile come from PEAT_TOKEN and PEAT_CAFILE: a node with
	// http.tokens_file and http.tls (ops_auth.go).
	token, cafile string
}

// newOpsFlags defines the shared flags on a new FlagSet named "peat
// NAME", whose Usage prints usage and the flags to w.
func newOpsFlags(name, usage string, o *opsOptions, w io.Writer, lookupEnv func(string) (string, bool)) *flag.FlagSet {
	fs := newNodeFlags(name, usage, o, w, lookupEnv)
	fs.StringVar(&o.output, "o", "text", "output: text or json")
	return fs
}

// newNodeFlags defines --http and --timeout only (peat check prints one
// line, in the monitoring plugins' format).
func newNodeFlags(name, usage string, o *opsOptions, w io.Writer, lookupEnv func(string) (string, bool)) *flag.FlagSet {
	fs := flag.NewFlagSet("peat "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	def := defaultNodeHTTP
	if v, ok := lookupEnv("PEAT_HTTP"); ok && v != "" {
		def = v
	}
	fs.StringVar(&o.http, "http", def, "the node's HTTP address, host:port or a URL (env PEAT_HTTP; https:// with PEAT_CAFILE, and PEAT_TOKEN for a node with tokens)")
	o.token, _ = lookupEnv(opsTokenEnv)
	o.cafile, _ = lookupEnv(opsCAFileEnv)
	o.output = "text"
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for the node")
	fs.Usage = func() {
		fmt.Fprint(w, usage)
		printFlags(w, fs)
	}
	return fs
}

// parseOps parses args; it returns the exit status to stop with, or -1 to
// go on.
func parseOps(fs *flag.FlagSet, o *opsOptions, args []string, stderr io.Writer) int {
	rest, err := parseInterspersed(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp): // flag printed the help
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the flags.\n", fs.Name(), err, fs.Name())
		return exitUsage
	case len(rest) > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", fs.Name(), rest[0])
		return exitUsage
	case o.output != "text" && o.output != "json":
		fmt.Fprintf(stderr, "%s: -o must be text or json, got %q\n", fs.Name(), o.output)
		return exitUsage
	}
	return -1
}

// getJSON fetches path from the node and decodes it into v.
func getJSON(o opsOptions, path string, v any) error { return callJSON(o, http.MethodGet, path, v) }

// callJSON sends a bodiless request to the node and decodes its JSON
// answer (200 or 202) into v.
func callJSON(o opsOptions, method, path string, v any) error {
	base := strings.TrimSuffix(o.http, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		return fmt.Errorf("bad --http %q: %w", o.http, err)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json") // the node refuses a change a form could send
	}
	client, err := o.authorize(req)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("ask the node at %s: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read %s%s: %w", base, path, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusAccepted {
		var e struct{ Error string }
		if json.Unmarshal(body, &e) == nil && e.Error != "" {
			return &apiStatusError{resp.StatusCode, fmt.Sprintf("%s%s: %s: %s", base, path, resp.Status, e.Error)}
		}
		return &apiStatusError{resp.StatusCode, fmt.Sprintf("%s%s: %s", base, path, resp.Status)}
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("%s%s: not the JSON expected (is it a Peat node?): %w", base, path, err)
	}
	return nil
}

// apiStatusError is a node's answer other than 200 or 202: code tells a
// refusal (4xx) from a node that cannot answer.
type apiStatusError struct {
	code int
	msg  string
}

func (e *apiStatusError) Error() string { return e.msg }

func writeJSONOut(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func statusCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("status", statusUsage, &o, stdout, lookupEnv)
	if code := parseOps(fs, &o, args, stderr); code >= 0 {
		return code
	}
	var st status.Status
	if err := getJSON(o, "/api/v1/status", &st); err != nil {
		fmt.Fprintf(stderr, "peat status: %v\n", err)
		return exitUnknown
	}
	if o.output == "json" {
		writeJSONOut(stdout, st)
	} else {
		printStatus(stdout, &st)
	}
	if len(st.Alarms) > 0 {
		return exitAlarm
	}
	return exitOK
}

func printStatus(w io.Writer, st *status.Status) {
	n := st.Node
	fmt.Fprintf(w, "node      %s  %s (%s)  up %s  storage %s\n", n.ID, n.Version, n.Commit,
		status.FormatDuration(n.UptimeSeconds), n.Profile)
	var ls []string
	for _, l := range st.Listeners {
		ls = append(ls, l.Protocol+" "+l.Address)
	}
	fmt.Fprintf(w, "listen    %s\n", strings.Join(ls, "  "))
	fmt.Fprintf(w, "clients   %s connected\n", status.FormatCount(float64(st.Clients.Connected)))
	r := st.Rates
	fmt.Fprintf(w, "rates     stored %.1f/s  delivered %.1f/s  refused %.1f/s  (last %s)\n",
		r.Published, r.Delivered, r.Refused, status.FormatDuration(r.WindowSeconds))
	s := st.Sessions
	fmt.Fprintf(w, "sessions  %d durable (%d connected)", s.Durable, s.Connected)
	if s.MaxLagRecords > 0 {
		fmt.Fprintf(w, ", largest lag %s records (client %s, stream %s)", status.FormatCount(float64(s.MaxLagRecords)), s.MaxLagClient, s.MaxLagStream)
	}
	fmt.Fprintln(w)
	d := st.Disk
	switch {
	case !d.Known:
		fmt.Fprintf(w, "disk      %s: free space unknown\n", d.Dir)
	default:
		fmt.Fprintf(w, "disk      %s: %s free of %s, reserve %s\n", d.Dir, status.FormatBytes(float64(d.FreeBytes)),
			status.FormatBytes(float64(d.SizeBytes)), status.FormatBytes(float64(d.ReserveBytes)))
	}
	fmt.Fprintf(w, "streams   %d\n", len(st.Streams))
	printStreams(w, st.Streams, "  ")
	fmt.Fprintf(w, "groups    %d\n", len(st.Groups))
	printGroups(w, st.Groups, "  ")
	if len(st.Sinks) > 0 {
		fmt.Fprintf(w, "sinks     %d\n", len(st.Sinks))
		printSinks(w, st.Sinks, "  ")
	}
	if len(st.Sources) > 0 {
		fmt.Fprintf(w, "sources   %d\n", len(st.Sources))
		printSources(w, st.Sources, "  ")
	}
	if len(st.Alarms) == 0 {
		fmt.Fprintln(w, "alarms    none")
		return
	}
	fmt.Fprintf(w, "alarms    %d\n", len(st.Alarms))
	for _, a := range st.Alarms {
		fmt.Fprintf(w, "  %s %s: %s\n", strings.ToUpper(a.Severity), a.ID, a.Message)
	}
}

func printStreams(w io.Writer, streams []status.Stream, indent string) {
	if len(streams) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sSTREAM\tFIRST\tNEXT\tRECORDS\tSIZE\tOLDEST\tRETENTION\tFILTERS\n", indent)
	for _, s := range streams {
		oldest := "-"
		if s.OldestAgeSeconds != nil {
			oldest = status.FormatDuration(*s.OldestAgeSeconds)
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", indent, s.Name,
			status.FormatCount(float64(s.FirstOffset)), status.FormatCount(float64(s.NextOffset)),
			status.FormatCount(float64(s.Records)), status.FormatBytes(float64(s.Bytes)), oldest,
			status.FormatRetention(s.Retention), strings.Join(s.Filters, " "))
	}
	_ = tw.Flush()
}

func printSinks(w io.Writer, sinks []status.Sink, indent string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sSINK\tKIND\tUPSTREAM\tSTATE\tLAG\tOLDEST UNSENT\tLAST ERROR\n", indent)
	for _, s := range sinks {
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\n", indent, s.Name, s.Kind, s.Upstream, s.State,
			status.FormatCount(float64(s.LagRecords)), status.FormatDuration(s.LagSeconds), s.LastError)
	}
	_ = tw.Flush()
}

// printSources shows each source: a "-" lag is an upstream that does not
// report one (MQTT).
func printSources(w io.Writer, sources []status.Source, indent string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sSOURCE\tKIND\tUPSTREAM\tSTREAM\tSTATE\tRECEIVED\tLAST RECEIVED\tLAG\tLAST ERROR\n", indent)
	for _, s := range sources {
		last, lag := "never", "-"
		if s.LastReceivedSeconds != nil {
			last = status.FormatDuration(*s.LastReceivedSeconds) + " ago"
		}
		if s.LagRecords != nil {
			lag = status.FormatCount(float64(*s.LagRecords))
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", indent, s.Name, s.Kind, s.Upstream, s.Stream, s.State,
			status.FormatCount(float64(s.Received)), last, lag, s.LastError)
	}
	_ = tw.Flush()
}

func printGroups(w io.Writer, groups []status.Group, indent string) {
	if len(groups) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%sGROUP\tSTREAM\tCOMMITTED\tLAG\tBEHIND\tCONSUMER\n", indent)
	for _, g := range groups {
		committed, lag, behind := "-", "-", "-"
		if g.CommittedOffset != nil {
			committed = status.FormatCount(float64(*g.CommittedOffset))
		}
		if g.LagRecords != nil {
			lag = status.FormatCount(float64(*g.LagRecords))
		}
		if g.LagSeconds != nil {
			behind = status.FormatDuration(*g.LagSeconds)
		}
		consumer := g.Consumer
		if consumer == "" {
			consumer = "(none)"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%s\t%s\t%s\n", indent, g.Group, g.Stream, committed, lag, behind, consumer)
	}
	_ = tw.Flush()
}

func streamsCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("streams", streamsUsage, &o, stdout, lookupEnv)
	if code := parseOps(fs, &o, args, stderr); code >= 0 {
		return code
	}
	var st status.Status
	if err := getJSON(o, "/api/v1/status", &st); err != nil {
		fmt.Fprintf(stderr, "peat streams: %v\n", err)
		return exitUnknown
	}
	if o.output == "json" {
		writeJSONOut(stdout, st.Streams)
		return exitOK
	}
	if len(st.Streams) == 0 {
		fmt.Fprintln(stdout, "no streams")
	}
	printStreams(stdout, st.Streams, "")
	return exitOK
}

func groupsCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("groups", groupsUsage, &o, stdout, lookupEnv)
	if code := parseOps(fs, &o, args, stderr); code >= 0 {
		return code
	}
	var groups []status.Group
	if err := getJSON(o, "/api/v1/groups", &groups); err != nil {
		fmt.Fprintf(stderr, "peat groups: %v\n", err)
		return exitUnknown
	}
	if o.output == "json" {
		writeJSONOut(stdout, groups)
		return exitOK
	}
	if len(groups) == 0 {
		fmt.Fprintln(stdout, "no consumer groups")
	}
	printGroups(stdout, groups, "")
	return exitOK
}
