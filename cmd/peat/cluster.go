package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/peatmq/peat/cluster"
)

const clusterUsage = `Usage: peat cluster [flags]
       peat cluster remove-node [flags] NODE_ID
       peat cluster keep-node [flags] NODE_ID
       peat cluster rebalance [flags]

Prints a site node's view of its site (GET /api/v1/cluster): the node and
whether it has caught up (its /readyz), the controller and the voters,
the members with their state and tags, each stream's leader, replicas,
ISR and this node's high watermark and log end, and, for the streams
this node leads, each replica's lag in records.

Exit status: 0 while the node has caught up and every stream has a full
ISR, 1 otherwise (not caught up, a stream under-replicated or without a
leader), 2 for bad flags, 3 when the node cannot be asked or is not in a
cluster.

remove-node takes a member out of the site, through any of its nodes
(POST /api/v1/cluster/nodes/NODE_ID/remove, an admin token where there
are tokens). The controller moves each of its replicas to an alive
broker: the new replica catches up and joins the ISR, then the old one
is dropped; a voter leaves the controller's quorum. A dead member (a Pi
replaced by one with a new node_id) is refused if it alone holds a
stream's committed records. A live member is drained (a decommission):
it keeps serving while its replicas and leaderships move, is shown
"drained" once it holds none, and is removed when you then stop it;
refused when its streams have no other broker to go to (add one, or
lower replication_factor), or when the voters left alive would not be a
majority. Watch the moves with 'peat cluster'. cluster.replace_after
removes a member failed that long on its own.

keep-node ends a live member's drain (POST
/api/v1/cluster/nodes/NODE_ID/keep): it may be given replicas again and
a voter rejoins the quorum; replicas that already moved stay where they
are. Refused once the drained member was stopped and removed.

rebalance spreads the replicas over the site (POST
/api/v1/cluster/rebalance), typically after nodes joined: streams keep
their replicas until a node leaves, so new nodes hold nothing until
then. It moves replicas from the nodes holding the most to those
holding the fewest until no node holds more than one more than another,
and prints each move (stream: from -> to). Each new replica catches up
and joins the ISR before the old one is dropped; 'peat cluster' shows
the streams still moving. Streams under-replicated, out of sync or
already moving wait for a later run.

Exit status of these three: 0 when recorded (rebalance: also when
nothing needs to move), 1 when refused (rebalance: also when nothing
can move yet), 2 for bad flags, 3 when the node cannot be asked.

Flags:
`

// exitSiteUnwell is what `peat cluster` exits with while the node has not
// caught up or a stream is under-replicated or offline.
const exitSiteUnwell = 1

func clusterCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	if len(args) > 0 && args[0] == "remove-node" {
		return removeNodeCmd(args[1:], stdout, stderr, lookupEnv)
	}
	if len(args) > 0 && args[0] == "keep-node" {
		return keepNodeCmd(args[1:], stdout, stderr, lookupEnv)
	}
	if len(args) > 0 && args[0] == "rebalance" {
		return rebalanceCmd(args[1:], stdout, stderr, lookupEnv)
	}
	var o opsOptions
	fs := newOpsFlags("cluster", clusterUsage, &o, stdout, lookupEnv)
	if code := parseOps(fs, &o, args, stderr); code >= 0 {
		return code
	}
	var st cluster.SiteStatus
	if err := getJSON(o, "/api/v1/cluster", &st); err != nil {
		fmt.Fprintf(stderr, "peat cluster: %v\n", err)
		return exitUnknown
	}
	if o.output == "json" {
		writeJSONOut(stdout, st)
	} else {
		printCluster(stdout, &st)
	}
	if !siteWell(&st) {
		return exitSiteUnwell
	}
	return exitOK
}

// siteWell: the node has caught up and every stream has a leader and a
// full ISR.
func siteWell(st *cluster.SiteStatus) bool {
	if !st.Ready {
		return false
	}
	for _, s := range st.Streams {
		if s.UnderReplicated || s.Leader == "" {
			return false
		}
	}
	return true
}

func printCluster(w io.Writer, st *cluster.SiteStatus) {
	role := "broker"
	if st.Voter {
		role = "voter"
	}
	ready := "caught up"
	if !st.Ready {
		ready = "NOT CAUGHT UP: " + st.NotReady
	}
	fmt.Fprintf(w, "node        %s  site %s  %s  broker epoch %d  %s\n", st.NodeID, orDash(st.Site), role, st.BrokerEpoch, ready)
	ctl := orDash(st.Controller)
	if st.IsController {
		ctl += " (this node)"
	}
	fmt.Fprintf(w, "controller  %s  voters %s  non-voters %s  (%d controller changes seen)\n", ctl,
		orDash(strings.Join(st.Voters, " ")), orDash(strings.Join(st.NonVoters, " ")), st.ControllerChanges)
	alive := 0
	for _, m := range st.Members {
		if m.State == "alive" {
			alive++
		}
	}
	fmt.Fprintf(w, "members     %d (%d alive)\n", len(st.Members), alive)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  MEMBER\tSTATE\tROLE\tMQTT\tCLUSTER\tVERSION\tBROKER EPOCH\n")
	for _, m := range st.Members {
		state := m.State
		switch m.Removal {
		case "draining":
			state += fmt.Sprintf(" (draining: %s)", strings.Join(m.Holds, ","))
		case "drained":
			state += " (drained: stop it)"
		case "removed":
			state += " (removed)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\n", m.ID, state, m.Role, orDash(m.MQTTAddr),
			orDash(m.ClusterAddr), orDash(m.Version), m.BrokerEpoch)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "streams     %d\n", len(st.Streams))
	if len(st.Streams) > 0 {
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "  STREAM\tLEADER\tEPOCH\tREPLICAS\tISR\tHW\tLOG END\tSTATE\n")
		for _, s := range st.Streams {
			state := "ok"
			switch {
			case s.Leader == "":
				state = "OFFLINE"
			case s.UnderReplicated && len(s.Replicas) < s.ReplicationFactor:
				state = fmt.Sprintf("UNDER-REPLICATED (%d of %d replicas)", len(s.Replicas), s.ReplicationFactor)
			case s.UnderReplicated:
				state = "UNDER-REPLICATED"
			}
			for _, m := range s.Moving {
				state += fmt.Sprintf(", moving %s -> %s", m.From, m.To)
			}
			hw, end := "-", "-"
			if s.LocalReplica {
				hw, end = strconv.FormatUint(s.HighWatermark, 10), strconv.FormatUint(s.LogEnd, 10)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Name, orDash(s.Leader), s.LeaderEpoch,
				strings.Join(s.Replicas, ","), strings.Join(s.ISR, ","), hw, end, state)
		}
		_ = tw.Flush()
	}
	var lag [][]string
	for _, s := range st.Streams {
		for _, r := range s.ReplicaLag {
			end := "-"
			if r.Fetched {
				end = strconv.FormatUint(r.LogEnd, 10)
			}
			inISR := "no"
			if r.InISR {
				inISR = "yes"
			}
			lag = append(lag, []string{s.Name, r.ID, end, strconv.FormatUint(r.LagRecords, 10), inISR})
		}
	}
	if len(lag) == 0 {
		return
	}
	fmt.Fprintln(w, "replicas    of the streams this node leads")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  STREAM\tREPLICA\tLOG END\tLAG\tIN ISR\n")
	for _, l := range lag {
		fmt.Fprintf(tw, "  %s\n", strings.Join(l, "\t"))
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// removeNodeCmd is `peat cluster remove-node NODE_ID`.
func removeNodeCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("cluster remove-node", clusterUsage, &o, stdout, lookupEnv)
	var rm cluster.Removal
	if code, done := adminCall("peat cluster remove-node", "peat cluster", "NODE_ID", fs, &o, args, stderr,
		http.MethodPost, func(id string) string { return "/api/v1/cluster/nodes/" + url.PathEscape(id) + "/remove" }, &rm); done {
		return code
	}
	if o.output == "json" {
		writeJSONOut(stdout, rm)
		return exitOK
	}
	switch {
	case rm.Draining && len(rm.Moving) == 0:
		fmt.Fprintf(stdout, "draining %s; it holds no replica: stop it, and the site removes it\n", rm.Node)
	case rm.Draining:
		fmt.Fprintf(stdout, "draining %s; it serves while its replicas of %s move to other brokers; "+
			"stop it once 'peat cluster' shows it drained\n", rm.Node, strings.Join(rm.Moving, ", "))
	case len(rm.Moving) == 0:
		fmt.Fprintf(stdout, "removed %s; it held no replica\n", rm.Node)
	default:
		fmt.Fprintf(stdout, "removed %s; moving its replicas of %s to other brokers (watch with 'peat cluster')\n",
			rm.Node, strings.Join(rm.Moving, ", "))
	}
	return exitOK
}

// keepNodeCmd is `peat cluster keep-node NODE_ID`.
func keepNodeCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("cluster keep-node", clusterUsage, &o, stdout, lookupEnv)
	var kept struct {
		Node string `json:"node"`
	}
	if code, done := adminCall("peat cluster keep-node", "peat cluster", "NODE_ID", fs, &o, args, stderr,
		http.MethodPost, func(id string) string { return "/api/v1/cluster/nodes/" + url.PathEscape(id) + "/keep" }, &kept); done {
		return code
	}
	if o.output == "json" {
		writeJSONOut(stdout, kept)
		return exitOK
	}
	fmt.Fprintf(stdout, "keeping %s in the site: no longer draining; it may get replicas again\n", kept.Node)
	return exitOK
}

// adminCall is what the one-argument admin commands share (peat cluster
// remove-node and keep-node ID, peat stream delete NAME): it parses args for exactly one
// argument (named what in errors), sends method to path(arg) and decodes
// the answer into out. done is true when the command ends there, with
// code: bad flags or arguments (exitUsage), help (exitOK), a refusal
// (4xx: exitSiteUnwell) or a node that cannot be asked (exitUnknown).
func adminCall(cmd, helpCmd, what string, fs *flag.FlagSet, o *opsOptions, args []string, stderr io.Writer,
	method string, path func(arg string) string, out any) (code int, done bool) {
	rest, err := parseInterspersed(fs, args)
	switch {
	case errors.Is(err, flag.ErrHelp): // flag printed the help
		return exitOK, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun '%s --help' for the flags.\n", cmd, err, helpCmd)
		return exitUsage, true
	case len(rest) != 1 || rest[0] == "":
		fmt.Fprintf(stderr, "%s: one %s expected, got %q\n", cmd, what, rest)
		return exitUsage, true
	case o.output != "text" && o.output != "json":
		fmt.Fprintf(stderr, "%s: -o must be text or json, got %q\n", cmd, o.output)
		return exitUsage, true
	}
	return adminSend(cmd, *o, method, path(rest[0]), out, stderr)
}

// adminSend sends an admin command's request and decodes the answer
// into out; done and code as adminCall's.
func adminSend(cmd string, o opsOptions, method, path string, out any, stderr io.Writer) (code int, done bool) {
	err := callJSON(o, method, path, out)
	var refused *apiStatusError
	switch {
	case errors.As(err, &refused) && refused.code >= 400 && refused.code < 500:
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitSiteUnwell, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitUnknown, true
	}
	return 0, false
}

// rebalanceCmd is `peat cluster rebalance`.
func rebalanceCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("cluster rebalance", clusterUsage, &o, stdout, lookupEnv)
	if code := parseOps(fs, &o, args, stderr); code >= 0 {
		return code
	}
	var rb cluster.Rebalancing
	if code, done := adminSend("peat cluster rebalance", o, http.MethodPost, "/api/v1/cluster/rebalance", &rb, stderr); done {
		return code
	}
	if o.output == "json" {
		writeJSONOut(stdout, rb)
	} else {
		printRebalance(stdout, &rb)
	}
	if len(rb.Moves) == 0 && !rb.Balanced {
		return exitSiteUnwell
	}
	return exitOK
}

func printRebalance(w io.Writer, rb *cluster.Rebalancing) {
	var counts []string
	for _, id := range slices.Sorted(maps.Keys(rb.Replicas)) {
		counts = append(counts, fmt.Sprintf("%s %d", id, rb.Replicas[id]))
	}
	per := strings.Join(counts, ", ")
	switch {
	case len(rb.Moves) == 0 && rb.Balanced:
		fmt.Fprintf(w, "nothing to move: the replicas are spread within one per node (%s)\n", per)
		return
	case len(rb.Moves) == 0:
		fmt.Fprintf(w, "nothing can move now (%s): the streams that would move are under-replicated, out of sync "+
			"or moving already; run it again once 'peat cluster' shows them settled\n", per)
		return
	}
	fmt.Fprintf(w, "moving %d replica(s), each new one syncing before the old one goes (watch with 'peat cluster'):\n",
		len(rb.Moves))
	for _, m := range rb.Moves {
		fmt.Fprintf(w, "  %s: %s -> %s\n", m.Stream, m.From, m.To)
	}
	fmt.Fprintf(w, "replicas per node once done: %s\n", per)
}
