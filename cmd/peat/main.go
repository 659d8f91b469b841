// Command peat is the Peat broker: an MQTT broker that keeps every message
// in a durable offset log. This file is the thin command line; the node
// itself is package edge.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/peatmq/peat/edge"
)

// Set with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "dev"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1 // the node failed while starting or stopping
	exitUsage = 2 // bad flag, bad config
)

// Attribute keys of the command's log lines.
const (
	attrVersion = "version"
	attrCommit  = "commit"
	attrErr     = "err"
	attrSignal  = "signal"
	attrTimeout = "timeout"
	attrTook    = "took"
)

// shutdownTimeout bounds a clean shutdown after SIGTERM or SIGINT.
const shutdownTimeout = 5 * time.Second

const usage = `peat is an MQTT broker that keeps every message in a durable offset log.

Usage:
  peat serve [flags]   run a node (no flags: data in ./data, MQTT on 127.0.0.1:1883, HTTP on 127.0.0.1:8080)
  peat replay [flags] FILTER
                       print stored records (offset, time, topic, payload) from any offset, then optionally follow
  peat status [flags]  a running node at a glance (exit 1 while an alarm is active)
  peat streams [flags] a running node's streams
  peat groups [flags]  a running node's consumer groups and their lag
  peat cluster [flags] a site node's view of its site: members, controller, each stream's ISR and replica lag
  peat cluster remove-node [flags] NODE_ID
                       a member is gone for good: the site moves its replicas to other brokers
  peat stream delete [flags] NAME
                       delete a stream the configuration no longer lists, with its records
  peat check [flags]   check a running node for Nagios, Icinga or cron (exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN)
  peat passwd [-D] FILE USER
                       add a user to a users file (auth.users_file), change its password, or delete it
  peat token FILE NAME ROLE
                       add an HTTP API token (read or admin) to a tokens file (http.tokens_file) and print it
  peat version         print the version
  peat help [command]  print this help, or one command's

'peat help COMMAND' and 'peat COMMAND --help' print one command's help.
`

const serveUsage = `Usage: peat serve [flags]

Runs a node. Flags override the environment, which overrides the config file.

Flags:
`

const versionUsage = `Usage: peat version

Prints the version, the commit, the Go version and the platform.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv))
}

// run is main without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stdout, stderr, lookupEnv)
	case "replay":
		return replay(args[1:], stdout, stderr)
	case "status":
		return statusCmd(args[1:], stdout, stderr, lookupEnv)
	case "streams":
		return streamsCmd(args[1:], stdout, stderr, lookupEnv)
	case "groups":
		return groupsCmd(args[1:], stdout, stderr, lookupEnv)
	case "cluster":
		return clusterCmd(args[1:], stdout, stderr, lookupEnv)
	case "stream":
		return streamCmd(args[1:], stdout, stderr, lookupEnv)
	case "check":
		return checkCmd(args[1:], stdout, stderr, lookupEnv)
	case "passwd":
		return passwd(args[1:], os.Stdin, stdout, stderr)
	case "token":
		return token(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "peat %s (commit %s, %s, %s/%s)\n", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return exitOK
	case "help", "--help", "-help", "-h":
		return help(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "peat: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
}

// help prints the overview and every command's flags, or, given a
// command, that command's help (as 'peat COMMAND --help' does).
func help(args []string, stdout, stderr io.Writer) int {
	var o replayOptions
	serveFS, _, _ := newServeFlags(stdout)
	replayFS := newReplayFlags(&o, stdout)
	var so opsOptions
	var co checkOptions
	opsFS := map[string]*flag.FlagSet{
		"status":  newOpsFlags("status", statusUsage, &so, stdout, os.LookupEnv),
		"streams": newOpsFlags("streams", streamsUsage, &so, stdout, os.LookupEnv),
		"groups":  newOpsFlags("groups", groupsUsage, &so, stdout, os.LookupEnv),
		"cluster": newOpsFlags("cluster", clusterUsage, &so, stdout, os.LookupEnv),
		"check":   newCheckFlags(&co, stdout, os.LookupEnv),
	}
	if len(args) == 0 {
		fmt.Fprint(stdout, usage)
		fmt.Fprint(stdout, "\nFlags of peat serve:\n")
		printFlags(stdout, serveFS)
		fmt.Fprint(stdout, "\nFlags of peat replay:\n")
		printFlags(stdout, replayFS)
		fmt.Fprint(stdout, "\nFlags of peat status, streams, groups and cluster:\n")
		printFlags(stdout, opsFS["status"])
		fmt.Fprint(stdout, "\nFlags of peat check (also --http and --timeout):\n")
		printFlags(stdout, opsFS["check"])
		return exitOK
	}
	if len(args) > 1 {
		fmt.Fprintf(stderr, "peat help: one command expected, got %q\n", args)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		serveFS.Usage()
	case "replay":
		replayFS.Usage()
	case "status", "streams", "groups", "cluster", "check":
		opsFS[args[0]].Usage()
	case "stream":
		newOpsFlags("stream delete", streamUsage, &so, stdout, os.LookupEnv).Usage()
	case "passwd":
		passwdHelp(stdout)
	case "token":
		fmt.Fprint(stdout, tokenUsage)
	case "version":
		fmt.Fprint(stdout, versionUsage)
	case "help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "peat help: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	return exitOK
}

// serveFlags are the flags of `peat serve`, each bound to a YAML path.
var serveFlags = []struct {
	name, path, help string
}{
	{"data", "data_dir", "data directory (default ./data; env PEAT_DATA_DIR)"},
	{"mqtt", "mqtt.listen", "MQTT listen address host:port, of the first listener with mqtt.listeners (default 127.0.0.1:1883; env PEAT_MQTT_LISTEN)"},
	{"http", "http.listen", "HTTP listen address host:port, empty to disable (default 127.0.0.1:8080; env PEAT_HTTP_LISTEN)"},
	{"profile", "storage.profile", "storage profile pi-zero, pi or server (default: pi on arm, server elsewhere; env PEAT_STORAGE_PROFILE)"},
	{"log-level", "log.level", "log level debug, info, warn or error (env PEAT_LOG_LEVEL)"},
	{"log-format", "log.format", "log format text or json (env PEAT_LOG_FORMAT)"},
}

// newServeFlags defines the flags of `peat serve` on a new FlagSet: the
// config file, and one per serveFlags entry. Its Usage prints serveUsage
// and the flags to w.
func newServeFlags(w io.Writer) (fs *flag.FlagSet, configPath *string, values map[string]*string) {
	fs = flag.NewFlagSet("peat serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by serve
	configPath = fs.String("config", "", "YAML config file (env PEAT_CONFIG; see configs/peat.yaml)")
	values = make(map[string]*string, len(serveFlags))
	for _, f := range serveFlags {
		values[f.name] = fs.String(f.name, "", f.help)
	}
	fs.Usage = func() {
		fmt.Fprint(w, serveUsage)
		printFlags(w, fs)
	}
	return fs, configPath, values
}

// loadConfig builds the configuration: defaults, then the file, then the
// environment, then flags. Its errors wrap edge.ErrConfig or flag errors;
// flag.ErrHelp after printing the help to help.
func loadConfig(args []string, help io.Writer, lookupEnv func(string) (string, bool)) (edge.Config, error) {
	fs, configPath, values := newServeFlags(help)
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return edge.Config{}, err // flag printed the help for -h and --help
	}
	if len(positional) > 0 {
		return edge.Config{}, fmt.Errorf("unexpected argument %q (serve takes only flags)", positional[0])
	}

	path := *configPath
	if path == "" {
		path, _ = lookupEnv("PEAT_CONFIG")
	}
	cfg := edge.DefaultConfig()
	if path != "" {
		var err error
		if cfg, err = edge.LoadFile(path); err != nil {
			return edge.Config{}, err
		}
	}
	cfg.ApplyEnv(lookupEnv)
	var setErr error
	fs.Visit(func(fl *flag.Flag) {
		for _, f := range serveFlags {
			if f.name == fl.Name {
				setErr = errors.Join(setErr, cfg.Set(f.path, *values[f.name], "flag --"+f.name))
			}
		}
	})
	if setErr != nil {
		return edge.Config{}, setErr
	}
	return cfg, cfg.Validate()
}

func serve(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	cfg, err := loadConfig(args, stdout, lookupEnv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case err != nil:
		printConfigError(stderr, err)
		return exitUsage
	}
	logger := newLogger(stderr, cfg.Log)
	logger.Info("starting peat", attrVersion, version, attrCommit, commit)

	// Signals are caught before Start so a SIGTERM during start-up is a
	// clean shutdown too.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	node, err := edge.New(cfg, logger)
	if err != nil {
		printConfigError(stderr, err)
		return exitUsage
	}
	node.SetBuild(edge.Build{Version: version, Commit: commit})
	defer reloadOnHangup(node, logger)()
	started := make(chan error, 1)
	go func() { started <- node.Start(ctx) }()
	var sig os.Signal
	select {
	case err := <-started:
		if err != nil {
			logger.Error("start failed", attrErr, err)
			return exitError
		}
		sig = <-sigs
	case sig = <-sigs:
		cancel()
		<-started
	}

	logger.Info("shutting down", attrSignal, sig.String(), attrTimeout, shutdownTimeout)
	begin := time.Now()
	closeCtx, cancelClose := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancelClose()
	closed := make(chan error, 1)
	go func() { closed <- node.Close(closeCtx) }()
	select {
	case err = <-closed:
	case sig = <-sigs:
		logger.Warn("second signal: exiting without a clean shutdown", attrSignal, sig.String())
		return exitError
	}
	if err != nil {
		logger.Error("shutdown failed", attrErr, err, attrTook, time.Since(begin))
		return exitError
	}
	logger.Info("stopped", attrTook, time.Since(begin))
	return exitOK
}

// printConfigError writes a configuration or flag error, each problem on
// its own line.
func printConfigError(w io.Writer, err error) {
	if !errors.Is(err, edge.ErrConfig) { // a flag error
		fmt.Fprintf(w, "peat serve: %v\nRun 'peat serve --help' for the flags.\n", err)
		return
	}
	leaves := edge.Problems(err)
	if len(leaves) == 1 {
		fmt.Fprintf(w, "peat serve: invalid configuration: %s\n", leaves[0])
		return
	}
	fmt.Fprintf(w, "peat serve: invalid configuration (%d problems):\n", len(leaves))
	for _, l := range leaves {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

func newLogger(w io.Writer, c edge.LogConfig) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level)) // validated
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
