package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/peatmq/peat/edge"
)

const streamUsage = `Usage: peat stream delete [flags] NAME

Deletes a stream the node's configuration no longer lists, with its
records, group offsets and session positions (DELETE /api/v1/streams/NAME,
an admin token where there are tokens). A stream is never deleted because
its line left streams: (a typo must not wipe a stream): its records stay
on disk, unread, until this command. GET /api/v1/streams shows such
streams with "unlisted": true, and peat serve logs them at start.

A stream the node still lists is refused: remove it from streams:,
restart peat, then delete it. In a site the controller records the
deletion and every replica deletes its copy, a node down at the time
once it is back; it is refused while any node's configuration lists the
stream (as that node registered it at its last start), and a stream of
the same name created later is a new stream from offset 0.

A large stream on a slow card may take longer than --timeout to delete:
the node finishes anyway (after a crash, at its next start).

Exit status: 0 when deleted (in a site: recorded), 1 when refused, 2 for
bad flags, 3 when the node cannot be asked.

Flags:
`

// streamCmd is `peat stream delete NAME`.
func streamCmd(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) int {
	var o opsOptions
	fs := newOpsFlags("stream delete", streamUsage, &o, stdout, lookupEnv)
	if len(args) == 0 || args[0] != "delete" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fs.Usage()
			return exitOK
		}
		fmt.Fprintln(stderr, "peat stream: 'delete NAME' expected; 'peat stream --help' tells more")
		return exitUsage
	}
	var d edge.StreamDeletion
	if code, done := adminCall("peat stream delete", "peat stream", "stream NAME", fs, &o, args[1:], stderr,
		http.MethodDelete, func(name string) string { return "/api/v1/streams/" + url.PathEscape(name) }, &d); done {
		return code
	}
	switch {
	case o.output == "json":
		writeJSONOut(stdout, d)
	case d.Site:
		fmt.Fprintf(stdout, "deleted %s from the site; every replica deletes its copy\n", d.Name)
	default:
		fmt.Fprintf(stdout, "deleted %s: %d records, %d bytes\n", d.Name, d.Records, d.Bytes)
	}
	return exitOK
}
