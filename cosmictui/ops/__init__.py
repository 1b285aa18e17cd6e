"""UI-free operations behind the wizard and the headless commands (no Textual here).

Grouped by use case; the foundations at the top level are shared by all of them:

  config, runner, progress, relayproc,           foundations (settings, where commands run, the
  wording, vocabulary                            wizard's saved progress and this machine's probe
                                                 keys, the local relay process, how messages are
                                                 worded, CheckResult and the job status sets)
  setup/    checks, steps, relayup (step 2: start/attach, reach, probe), envfile + envapply (the
            `.env` editor, step 3), apply (step 4: apply and restart)
  jobs/     model (parsing), listing, recover, evidence (the verdict rule: the job's own pairing),
            verify (step 5: the test job, its watch and its verdict)
  metrics/  client (/metrics and /stats), pairings (/pairings), probe + probewatch (a relay by key)
  demo/     sandbox, dht, worker (the built-in demo deployment)
  session   the wizard's session (progress, ticks) over the use cases, shared with the CLI

The steps' use cases yield events and a result; screens and `cosmictui` commands only show them.
Imports point down only: foundations import no use case, ops imports no screen, widget or cli,
widgets import no screen, and there are no import cycles (tests/unit/test_layering.py).

Public API (signatures are stable; screens and CLI import from the submodules):

config      Settings (frozen dataclass), load_settings(config=None, **overrides) -> Settings,
            ConfigError, default_config_path(); constants ENV_VAR, *_COMMAND, RELAY_*.
            Command templates: delete_command uses {id}; create_command (empty = unknown) uses
            {name} {tags} {location} {gpu_model} {gpu_count} {image} {disk_gb}, {id} or any
            column; test_job_command is step 5's small test job. Settings.statuses -> StatusSets.
setup.envfile   plan_relays(text, key, mode="merge"|"replace", var=ENV_VAR, path=".env") -> EnvPlan
            (old, new, diff, old_keys, new_keys, line, .changed); read_relays(text, var) ->
            tuple of keys; normalize_key(key) -> z32; decode_text/encode_text (bytes <-> str,
            lossless); async write_plan(runner, path, plan) -> backup path | None (refuses,
            with EnvFileError, when the file changed since it was planned); EnvFileError(problem,
            line, fix, path).
runner      open_deployment(spec, *, env, known_hosts, client_keys, password, connect_timeout)
            -> Runner (LocalRunner | SSHRunner); parse_deployment(spec) -> DeploymentSpec.
            Runner: async run(cmd, cwd=None, on_output=None, timeout=None) -> CommandResult
            (cmd, exit_code, output, .ok); async read_file(path) -> bytes;
            async write_file_atomic(path, data, backup=True) -> backup path | None;
            async exists(path); resolve(path); async close(); async context manager.
            RunnerError(what, fix, host, kind) with kind in auth, host-key-mismatch,
            host-key-unknown, refused, unresolvable, timeout, missing-command,
            missing-directory, missing-file, io, error.
jobs.model   parse_jobs(output, now=None) -> list[Job] (only rows that are jobs); StatusSets
            (stuck/done/failed, .classify -> stuck|done|failed|unknown); Job(id, status, created, fields,
            updated); JobsFormatError(reason, raw); stuck_reason(job, now, stuck_after,
            stale_after) -> str | None; view_jobs(jobs, now, restart_at, ...) -> list[JobView]
            (job, age, before_restart, stuck); parse_when(text, now); format_age(seconds).
            All datetimes are timezone-aware UTC.
setup.checks  CheckResult(name, status "ok"|"warn"|"fail", detail, fix); check_relay_runs_here(),
            check_udp_port(port, host, storage), check_memory(minimum), check_storage(path),
            check_dht(stats), async fetch_stats(metrics_url), async check_deployment_host(runner),
            ping_command(host, port, timeout, python) -> str (stdlib `python3 -c` dht-rpc PING),
            dht_ping(host, port, timeout) -> (answered, detail) (same PING from this process),
            async check_relay_from_deployment(runner, host, port, timeout),
            async run_checks(settings, runner=None, ping_timeout=3.0) -> list[CheckResult].
relayproc   RelayRuntime, RelayStatus, RelayProcError; read_runtime(storage), pid_alive(pid),
            relay_status(storage), attach(storage), relay_command(...), async start_relay(storage,
            port, host, bootstrap, metrics, timeout, python) -> RelayRuntime, async
            stop_relay(storage, timeout) -> bool, read_key(storage), storage_key(storage) (the key
            a storage gives, without creating one), running_relays(), log_tail(storage, lines),
            key_change_warning(storage, previous_storage=None, configured_keys=(), running=None)
            -> str | None; on_before_start(storage, hook); runtime_path/log_path.
wording     sentence(text), sentences(*parts), command_failure_hint(cmd, exit_code, output).
progress    WizardProgress(deployment, current_step, completed, relay_storage, relay_key,
            env_backup, restarted_at, data); load_progress(deployment), save_progress(p),
            clear_progress(deployment), progress_path(deployment), state_dir().
demo.sandbox create_sandbox(root=None, *, relay_port, metrics_port, bootstrap, seed_jobs,
            start_dht=True) -> Sandbox(root, deployment, bin_dir, relay_storage, settings,
            env_path, state_path, .close(), .stop_dht()). `task restart` starts the sandbox
            worker (`demo.worker`: each new job = an agent and the worker meeting through the
            job's relay, punching off; stop_worker(state_path)). Without `bootstrap` the sandbox starts
            a private 5-node DHT on 127.0.0.1 (`demo.dht`, detached) because the relay needs a
            DHT to start; call Sandbox.close() in test teardown (it also exits by itself 15 min
            after the last relay on the sandbox storage stopped). ensure_dht(root, storage),
            stop_dht(root), set_failure(sandbox, task, message|None), sandbox_state(sandbox).
jobs.listing async list_jobs(run, settings, now, restart_at) -> JobListing(cmd, jobs, views, error,
            raw, exit_code, runner_error, .ok): the one jobs listing (wizard and CLI), one wording.
jobs.recover draft_create(job, settings) -> CreateDraft(command, missing, source, .known);
            plan_recovery(job, settings, reviewed_create=None) -> RecoveryPlan(job, delete, create
            | None, create_source); save_record(plan, settings, draft) -> Path (before any delete);
            async recover(run, plan, record) -> RecoveryResult(outcome recreated | deleted-only |
            delete-failed | create-failed, message, record, new_job_id, .lost); recovery_dir(deployment);
            async recover_jobs(run, plans, settings, listed) -> events: the one recover loop, naming
            the new job that replaces each recreated one when `listed` (the ids before) is given;
            RecreatedWatch(since, listed_before, replaced).observe(jobs) -> RecreatedVerdict: every
            recreated job watched until each left Creating, each named.
setup.leaving left_running(settings, storage, external=, demo=, resume_at=) -> LeftRunning(runtime, title,
            body, stop, unit) | None: the relay a quit leaves running here and how to stop it.
setup.envapply async apply_plan(runner, path, plan, var, key) -> AppliedPlan(path, backup, keys, key,
            .key_present, .problem()): write_plan plus the read-back (wizard step 3, env set-relay).
jobs.evidence Window(opened_at, job_since, relay_key, probe_keys); attribute(record, window, env_keys)
            -> Attribution(kind proven | cannot-tell | not-relayed | probe-only | older-only |
            env-dropped, reason, check, pairing, lines, short).
jobs.verify VerifySession(VerifyInputs, VerifyState): create_test_job(), poll(), run(interval,
            timeout, until_settled, wake) -> events JobsListed, TestJobCreated, TestJobFailed,
            Judged(VerifyVerdict(kind, message, level, job, attribution, check)).
setup.relayup plan_relay(settings, storage, port, want, env_keys, previous_storage, others) ->
            RelayPlan; bring_up(settings, plan, connect, timeout) -> events Stage, Note,
            LocalCommand, RelayRunning, RelayOutcome; prove_relay; attach_by_key.
setup.apply env_mismatch(env_keys, relay_key); apply_and_restart(run, settings, restart_began,
            restart_ended) -> events CommandBegan, CommandOutput, CommandEnded, ApplyDone.
metrics.pairings read_pairings(url, timeout) -> PairingRecord (hostile values are None);
            parse_pairings(body); NoPairingRecord (404: a relay that keeps none).
metrics.client  fetch + parse /metrics and /stats; metrics.probe: prove a relay carries a connection.
"""
