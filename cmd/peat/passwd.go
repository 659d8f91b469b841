package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/term"

	"github.com/peatmq/peat/edge/auth"
)

const passwdUsage = `Usage: peat passwd [-D] FILE USER

Adds USER to the users file FILE (auth.users_file), or changes USER's
password; FILE is created (mode 0600) if missing, and its other lines are
kept. The password is asked twice on a terminal, or read as one line from
standard input:

  peat passwd /etc/peat/users alice
  echo "$PASSWORD" | peat passwd /etc/peat/users sensor-17

The hash is argon2id. A running node reads the file again on SIGHUP
(systemctl reload peat).

Flags:
`

// newPasswdFlags defines the flags of `peat passwd`; its Usage prints
// passwdUsage and the flags to w.
func newPasswdFlags(w io.Writer) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("passwd", flag.ContinueOnError)
	fs.SetOutput(w)
	del := fs.Bool("D", false, "delete USER instead")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), passwdUsage)
		printFlags(fs.Output(), fs)
	}
	return fs, del
}

// passwdHelp prints the help of `peat passwd`.
func passwdHelp(w io.Writer) {
	fs, _ := newPasswdFlags(w)
	fs.Usage()
}

// passwd is `peat passwd`.
func passwd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs, del := newPasswdFlags(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 2 {
		fmt.Fprintln(stderr, "peat passwd: want FILE and USER")
		fs.Usage()
		return exitUsage
	}
	file, name := fs.Arg(0), fs.Arg(1)
	if name == "" || strings.ContainsAny(name, ": \t\r\n") {
		fmt.Fprintf(stderr, "peat passwd: user %q: must not be empty or hold ':' or spaces\n", name)
		return exitUsage
	}
	line := ""
	if !*del {
		pw, err := readPassword(stdin, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "peat passwd: %v\n", err)
			return exitError
		}
		h, err := auth.HashPassword(pw)
		if err != nil {
			fmt.Fprintf(stderr, "peat passwd: %v\n", err)
			return exitError
		}
		line = name + ":" + h
	}
	found, err := updateUsersFile(file, name, line)
	if err != nil {
		fmt.Fprintf(stderr, "peat passwd: %v\n", err)
		return exitError
	}
	switch {
	case *del && !found:
		fmt.Fprintf(stderr, "peat passwd: no user %q in %s\n", name, file)
		return exitError
	case *del:
		fmt.Fprintf(stdout, "deleted %s from %s\n", name, file)
	case found:
		fmt.Fprintf(stdout, "changed the password of %s in %s\n", name, file)
	default:
		fmt.Fprintf(stdout, "added %s to %s\n", name, file)
	}
	return exitOK
}

// readPassword asks twice on a terminal (without echo), or reads one line
// from a pipe.
func readPassword(stdin io.Reader, prompt io.Writer) (string, error) {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(prompt, "Password: ")
		a, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", err
		}
		fmt.Fprint(prompt, "Again: ")
		b, err := term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(prompt)
		if err != nil {
			return "", err
		}
		if !bytes.Equal(a, b) {
			return "", errors.New("the passwords differ")
		}
		if len(a) == 0 {
			return "", errors.New("empty password")
		}
		return string(a), nil
	}
	pw, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read the password: %w", err)
	}
	pw = strings.TrimRight(pw, "\r\n")
	if pw == "" {
		return "", errors.New("empty password on standard input")
	}
	return pw, nil
}

// updateUsersFile (users and tokens files alike: "name:..." lines) replaces name's line in file with line (deletes it when
// line is empty, appends it when name is not there) and writes the file
// anew beside the old one, then renames it over: a reader never sees half
// a file. It reports whether name was there.
func updateUsersFile(file, name, line string) (bool, error) {
	old, err := os.ReadFile(file)
	mode := os.FileMode(0o600)
	var info os.FileInfo
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return false, err
	default:
		if info, err = os.Stat(file); err != nil {
			return false, err
		}
		mode = info.Mode().Perm()
	}
	var out []string
	found := false
	for l := range strings.Lines(string(old)) {
		l = strings.TrimRight(l, "\r\n")
		if u, _, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && u == name && !strings.HasPrefix(strings.TrimSpace(l), "#") {
			found = true
			if line != "" {
				out = append(out, line)
				line = ""
			}
			continue
		}
		out = append(out, l)
	}
	if line != "" {
		out = append(out, line)
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".peat-users-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return false, err
	}
	if info != nil {
		if err := keepOwner(tmp, info); err != nil {
			tmp.Close()
			return false, err
		}
	}
	text := strings.Join(out, "\n")
	if text != "" {
		text += "\n"
	}
	if _, err := tmp.WriteString(text); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return found, os.Rename(tmp.Name(), file)
}
