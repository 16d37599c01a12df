// Command composevalidate loads a Compose file with compose-go, the loader behind
// `docker compose config`: the file is checked against the Compose Specification's JSON
// schema, interpolated, normalised and checked for consistency (depends_on targets, declared
// volumes and networks, ...). On success it prints the normalised project as JSON on stdout;
// on failure it prints the loader's error on stderr and exits 1 (2 for bad usage).
//
// Only the variables given with -env are visible to interpolation: the process environment
// and any .env file are ignored, so `${VAR:-default}` always resolves to its default.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	var files, env multiFlag
	flag.Var(&files, "f", "Compose file (repeatable; later files override earlier ones)")
	flag.Var(&env, "env", "KEY=VALUE visible to interpolation (repeatable)")
	workdir := flag.String("workdir", "", "project directory (default: the first file's folder)")
	name := flag.String("project-name", "", "project name (default: the file's top-level name)")
	profiles := flag.String("profiles", "*", "comma-separated profiles to enable; * enables all")
	flag.Parse()
	if len(files) == 0 || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: composevalidate -f docker-compose.yml [-workdir DIR] [-profiles a,b] [-env K=V]")
		os.Exit(2)
	}

	var active []string
	for _, p := range strings.Split(*profiles, ",") {
		if p = strings.TrimSpace(p); p != "" {
			active = append(active, p)
		}
	}

	opts, err := cli.NewProjectOptions(files,
		cli.WithWorkingDirectory(*workdir),
		cli.WithName(*name),
		cli.WithEnv(env),
		cli.WithProfiles(active),
		cli.WithInterpolation(true),
		cli.WithNormalization(true),
		cli.WithConsistency(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		fail(err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		fail(err)
	}
	out, err := project.MarshalJSON()
	if err != nil {
		fail(err)
	}
	fmt.Println(string(out))
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "compose: %v\n", err)
	os.Exit(1)
}
