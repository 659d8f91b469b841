package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/peatmq/peat/edge/status"
)

// Nagios plugin exit statuses (also Icinga, Zabbix, Sensu, Checkmk).
const (
	checkOK       = 0
	checkWarning  = 1
	checkCritical = 2
	checkUnknown  = exitUnknown
)

var checkStates = [...]string{"OK", "WARNING", "CRITICAL", "UNKNOWN"}

const checkUsage = `Usage: peat check [flags]

Checks a running node for cron or a monitoring system (Nagios, Icinga,
Zabbix, Sensu) and prints one line in their plugins' format, with
performance data:

  PEAT CRITICAL - group billing in default is 12,000 records behind (max 10000) | 'billing/default'=12000;1000;10000

A critical alarm (publishes refused for disk space) is CRITICAL, a
warning alarm (disk space near the reserve) WARNING. Group thresholds
apply to every group that has committed, or only to --group.

Exit status: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the node cannot be
asked, bad flags, or no group named --group).

Flags:
`

type checkOptions struct {
	opsOptions
	group                 string
	warnLag, maxLag       int64
	warnBehind, maxBehind time.Duration
}

func newCheckFlags(o *checkOptions, w io.Writer, lookupEnv func(string) (string, bool)) *flag.FlagSet {
	fs := newNodeFlags("check", checkUsage, &o.opsOptions, w, lookupEnv)
	fs.StringVar(&o.group, "group", "", "check only this consumer group (default: every group)")
	fs.Int64Var(&o.warnLag, "warn-group-lag", -1, "WARNING when a group is more than this many records behind (-1: no check)")
	fs.Int64Var(&o.maxLag, "max-group-lag", -1, "CRITICAL when a group is more than this many records behind (-1: no check)")
	fs.DurationVar(&o.warnBehind, "warn-group-behind", 0, "WARNING when a group's oldest unconsumed record is older than this (0: no check)")
	fs.DurationVar(&o.maxBehind, "max-group-behind", 0, "CRITICAL when a group's oldest unconsumed record is older than this (0: no check)")
	return fs
}

func checkCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o checkOptions
	fs := newCheckFlags(&o, stdout, lookupEnv)
	if code := parseOps(fs, &o.opsOptions, args, stderr); code >= 0 {
		if code == exitUsage {
			return checkUnknown // a monitoring system reads 2 as CRITICAL
		}
		return code
	}
	var st status.Status
	if err := getJSON(o.opsOptions, "/api/v1/status", &st); err != nil {
		fmt.Fprintf(stdout, "PEAT UNKNOWN - %v\n", err)
		return checkUnknown
	}
	state, problems, perf := evaluate(&st, o)
	summary := strings.Join(problems, "; ")
	if state == checkOK {
		summary = fmt.Sprintf("%d streams, %d groups, no alarms", len(st.Streams), len(st.Groups))
	}
	line := "PEAT " + checkStates[state] + " - " + summary
	if len(perf) > 0 {
		line += " | " + strings.Join(perf, " ")
	}
	fmt.Fprintln(stdout, line)
	return state
}

// evaluate returns the worst state of st against o, what is wrong (worst
// first) and the performance data.
func evaluate(st *status.Status, o checkOptions) (state int, problems, perf []string) {
	var crit, warn []string
	for _, a := range st.Alarms {
		msg := a.ID + ": " + a.Message
		if a.Severity == status.SeverityCritical {
			crit = append(crit, msg)
		} else {
			warn = append(warn, msg)
		}
	}
	found := false
	for _, g := range st.Groups {
		if o.group != "" && g.Group != o.group {
			continue
		}
		found = true
		if g.LagRecords == nil {
			continue // never committed: nothing to measure
		}
		lag := int64(*g.LagRecords)
		name := fmt.Sprintf("group %s in %s", g.Group, g.Stream)
		perf = append(perf, fmt.Sprintf("'%s/%s'=%d;%s;%s", g.Group, g.Stream, lag, threshold(o.warnLag), threshold(o.maxLag)))
		switch {
		case o.maxLag >= 0 && lag > o.maxLag:
			crit = append(crit, fmt.Sprintf("%s is %s records behind (max %d)", name, status.FormatCount(float64(lag)), o.maxLag))
		case o.warnLag >= 0 && lag > o.warnLag:
			warn = append(warn, fmt.Sprintf("%s is %s records behind (warn %d)", name, status.FormatCount(float64(lag)), o.warnLag))
		}
		if g.LagSeconds == nil {
			continue
		}
		behind := time.Duration(*g.LagSeconds * float64(time.Second))
		switch {
		case o.maxBehind > 0 && behind > o.maxBehind:
			crit = append(crit, fmt.Sprintf("%s is %s behind (max %s)", name, status.FormatDuration(*g.LagSeconds), o.maxBehind))
		case o.warnBehind > 0 && behind > o.warnBehind:
			warn = append(warn, fmt.Sprintf("%s is %s behind (warn %s)", name, status.FormatDuration(*g.LagSeconds), o.warnBehind))
		}
	}
	if o.group != "" && !found {
		return checkUnknown, []string{fmt.Sprintf("no consumer group %q on this node", o.group)}, perf
	}
	switch {
	case len(crit) > 0:
		return checkCritical, append(crit, warn...), perf
	case len(warn) > 0:
		return checkWarning, warn, perf
	}
	return checkOK, nil, perf
}

func threshold(v int64) string {
	if v < 0 {
		return ""
	}
	return fmt.Sprint(v)
}
