package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseInterspersed parses fs from args and returns the positional
// arguments. Flags may come before or after them: Go's flag package stops
// at the first argument that is not a flag, so on its own it would read
// `peat replay 'sensors/#' --from earliest` as three filters. "--" ends the
// flags; everything after it is positional (a filter starting with '-').
// The help (fs.Usage) is printed for -h and --help only: the flag package
// prints it for a bad flag too, burying the one-line error under a page.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	positional, err := parseFlagsAndArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) && usage != nil {
		usage()
	}
	return positional, err
}

func parseFlagsAndArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// printFlags writes the flags of fs as the examples and the README spell
// them, with two dashes (flag.PrintDefaults writes one: -from).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if typ != "" {
			line += " " + typ
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "0s" {
			if typ == "string" {
				def = fmt.Sprintf("%q", def)
			}
			line += " (default " + def + ")"
		}
		fmt.Fprintln(w, line)
	})
}
