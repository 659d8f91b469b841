package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/peatmq/peat/edge/auth"
)

const tokenUsage = `Usage: peat token FILE NAME ROLE

Makes a random HTTP API bearer token, adds NAME's line (its SHA-256, not
the token) to the tokens file FILE (http.tokens_file; created mode 0600 if
missing, an existing NAME replaced), and prints the token once. ROLE is
read (GET) or admin (everything). A running node reads the file again on
SIGHUP.

  TOKEN=$(peat token /etc/peat/tokens grafana read)
  curl -H "Authorization: Bearer $TOKEN" localhost:8080/api/v1/streams
`

// token is `peat token`.
func token(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), tokenUsage) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 3 {
		fmt.Fprintln(stderr, "peat token: want FILE, NAME and ROLE")
		fs.Usage()
		return exitUsage
	}
	tok, line, err := auth.NewToken(fs.Arg(1), auth.Role(fs.Arg(2)))
	if err != nil {
		fmt.Fprintf(stderr, "peat token: %v\n", err)
		return exitUsage
	}
	if _, err := updateUsersFile(fs.Arg(0), fs.Arg(1), line); err != nil {
		fmt.Fprintf(stderr, "peat token: %v\n", err)
		return exitError
	}
	fmt.Fprintln(stdout, tok)
	return exitOK
}
