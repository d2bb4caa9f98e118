"""Serve the engine over an OpenAI-compatible API: ``python -m engine.serve --model NAME [engine options]``.

Binds the port before the model loads, so a port in use (or a bad option) is one line and exit code 2,
not a traceback after a minute of loading; the engine runs in a process of its own (engine.server.engine_process
says why). ``--port 0`` takes a free port; the address is printed as
``serving on http://HOST:PORT`` once the server accepts requests.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
from pathlib import Path

from cli.engine_replay import MAX_WARMUP_REQUESTS, cpu_fallback_note, out_of_memory_line
from cli.replay_args import add_config_groups
from engine.core.config_args import OneLineErrorParser, build_config
from engine.core.generation_defaults import read_generation_defaults
from engine.core.interrupt import EXIT_INTERRUPTED, EXIT_TERMINATED, NOTHING_WRITTEN, reader_gone_safe
from engine.core.model_config import ModelShape, generation_eos_token_ids, resolve_model_dir
from engine.options import EngineOptions
from engine.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES

DEFAULT_MAX_WAITING_REQUESTS = 4096
SHUTDOWN_GRACE_S = 10
# Requests still open after the grace period are ended with a 503 (a stream: an error event, then [DONE]), and get this
# long to send it before uvicorn cancels what is left.
SHUTDOWN_END_S = 3


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="python -m engine.serve",
        description="An OpenAI-compatible server (/v1/completions, /v1/chat/completions, /v1/models, /health, "
                    "/metrics) over the engine.",
    )
    add_config_groups(parser, EngineOptions, "GPU engine")
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)")
    server.add_argument("--port", type=int, default=8000, help="port (0: any free port; default 8000)")
    # Not an engine option (EngineOptions): engine.replay sets every request's sampling itself and has no use for it.
    server.add_argument("--generation-config", default="auto", metavar="{auto,vllm,FOLDER}",
                        help="default sampling parameters of requests that leave them out, as vLLM's option: auto "
                             "takes temperature, top_p, top_k and max_new_tokens (as max_tokens) from the model's "
                             "generation_config.json; vllm ignores the file (temperature 1, top_p 1, top_k off); a "
                             "folder reads its generation_config.json (default auto)")
    server.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: --model as given)")
    server.add_argument("--max-waiting-requests", type=int, default=DEFAULT_MAX_WAITING_REQUESTS,
                        help="requests queued beyond this are answered 503 (server overloaded) instead of waiting "
                             f"without bound (default {DEFAULT_MAX_WAITING_REQUESTS})")
    server.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                        help="a request body larger than this is answered 413 before it is read whole (default "
                             f"{DEFAULT_MAX_REQUEST_BODY_BYTES}, {DEFAULT_MAX_REQUEST_BODY_BYTES // 2**20} MiB)")
    server.add_argument("--warmup-requests", type=int, default=8,
                        help="short requests run before serving, so kernels are compiled before the first client "
                             "(default 8)")
    server.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                        help="server log level (default warning: no line per request)")
    server.add_argument("--keep-alive-on-engine-death", action="store_true",
                        help="when the engine process stops on its own (a crash, out of memory, killed), keep the "
                             "server up, answering 503 (/health too), instead of shutting it down with exit code 1 "
                             "as vLLM does (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH), so a supervisor restarts it")
    return parser


class _Terminated(BaseException):
    """SIGTERM arrived while the model loads (a BaseException, as KeyboardInterrupt: no `except Exception` takes it)."""


def _terminated_while_loading(signum, frame) -> None:
    # Once: a SIGTERM sent to the whole group reaches the server twice once the engine has loaded (the engine passes
    # its own on, engine.core.interrupt.defer_sigterm_to_parent), and a second raise would cut the first's cleanup.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated


class _SignalsBeforeServing:
    """The handler of Ctrl-C and SIGTERM from the model's load until uvicorn takes them over (the app is built, the
    event loop starts). There a Ctrl-C was a KeyboardInterrupt traceback (exit -2), and a SIGTERM killed the server
    at once (its default action, exit -15), the engine process left to Linux's parent-death signal, which logged an
    EOFError traceback. A signal before the server exists is kept (``signum``: the server then does not start); once
    it exists, the signal is the server's, as one while it serves: it starts, drains nothing and shuts down."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.server = None  # engine.server.signals.Server, once built

    def __call__(self, signum: int, frame) -> None:
        if self.server is not None:
            self.server.on_signal(signum, frame)
        elif self.signum is None:
            self.signum = signum


def _bind(host: str, port: int) -> socket.socket:
    given = host
    if host.startswith("[") and host.endswith("]"):  # an IPv6 address as URLs write it (and the server prints it)
        host = host[1:-1]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValueError(f"--host {given} --port {port}: cannot listen there: {exc.strerror or exc}") from exc
    return sock  # listened on once the engine is ready (asyncio's server does it), so no client waits on a load


def main(argv: list[str] | None = None) -> int:
    # A reader of its output that has gone (`engine.serve | head -1`, a log pipe that died) is no reason to stop
    # serving: the "serving on" line raised a BrokenPipeError, and the server exited 1 with three tracebacks.
    with reader_gone_safe():
        return _serve(argv)


def _serve(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.host.strip():  # bind("") listens on every interface: not what an empty value asks for
        parser.exit(2, "error: --host is empty; expected an address (127.0.0.1, or 0.0.0.0 for every interface)\n")
    if args.served_model_name is not None and not args.served_model_name.strip():
        # Clients must send this name (or none): an empty one was silently replaced by --model
        parser.exit(2, "error: --served-model-name is empty; expected the model name clients send (or leave it out: "
                       "--model is used)\n")
    if not 0 <= args.port <= 65535:
        parser.exit(2, f"error: --port must be from 0 to 65535, got {args.port}\n")
    # engine.replay's limit and line: the same warm-up (LLM.warm_up), refused at 1,001 here and taken to 10,000 there
    if not 0 <= args.warmup_requests <= MAX_WARMUP_REQUESTS:
        parser.exit(2, f"error: --warmup-requests must be an integer from 0 to {MAX_WARMUP_REQUESTS}, "
                       f"got {args.warmup_requests}\n")
    if args.max_waiting_requests < 1:
        parser.exit(2, f"error: --max-waiting-requests must be >= 1, got {args.max_waiting_requests}\n")
    if args.max_request_body_bytes < 1:
        parser.exit(2, f"error: --max-request-body-bytes must be >= 1, got {args.max_request_body_bytes}\n")
    sock = None
    try:  # Ctrl-C while the server's imports load (torch, fastapi: seconds) was a traceback
        try:
            import fastapi  # noqa: F401
            import prometheus_client  # noqa: F401
            import uvicorn
        except ImportError as exc:
            parser.exit(2, f"error: the server needs {exc.name}: pip install -e '.[serve]'\n")
        try:
            options = build_config(EngineOptions, args)
            # The model's config is read here too (no torch, milliseconds): a bad --model or --max-model-len was named
            # only after the engine process had started, as "--model M: ValueError: max_model_len=...".
            shape = ModelShape.load(options.model)
            options.check_model(shape)
            # So are the end-of-sequence ids of its generation_config.json: a bad one was refused by the engine process,
            # after torch had loaded, as "--model M: ValueError: " and the file's own line.
            generation_eos_token_ids(resolve_model_dir(options.model), shape.vocab_size)
            # So is its generation config: a default no request could take is refused here, naming the file and field.
            defaults = read_generation_defaults(resolve_model_dir(options.model), args.generation_config,
                                                option="--generation-config")
            # engine.replay's note: with --device auto and no CUDA device the server ran on the CPU without a word
            note = cpu_fallback_note(options, "engine.serve")
            sock = _bind(args.host, args.port)
        except (ValueError, FileNotFoundError) as exc:
            parser.exit(2, f"error: {exc}\n")
        if note:
            print(note, file=sys.stderr, flush=True)
        for line in defaults.report("--generation-config vllm"):  # as vLLM warns that the model overrode its defaults
            print(line, file=sys.stderr, flush=True)
        import asyncio
        import functools

        import prometheus_client

        from engine.llm import load_tokenizer
        from engine.server.api import build_app
        from engine.server.engine_client import EngineClient
        from engine.server.engine_process import load_llm
        from engine.server.launch import SERVING_PREFIX
        from engine.server.signals import Server

        logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        prometheus_client.disable_created_metrics()  # vLLM's scrape has no *_created series either
        model_name = args.served_model_name or options.model
        llm_options = {**{k: v for k, v in vars(options).items() if k != "model"},
                       "generation_config": args.generation_config}
        engine = EngineClient(functools.partial(load_llm, options.model, llm_options, args.warmup_requests),
                              model_name=model_name, max_waiting_requests=args.max_waiting_requests)
    except KeyboardInterrupt:
        if sock is not None:
            sock.close()
        print(NOTHING_WRITTEN, file=sys.stderr)
        return EXIT_INTERRUPTED
    stop_kwargs: dict = {}
    died: list[str] = []  # why the engine process stopped on its own, if it did
    try:  # whatever happens once the engine process exists, it is stopped: it is not a daemon, exit would wait on it
        # SIGTERM while the model loads (minutes for a large one; what systemd, Kubernetes and `timeout` send) killed
        # the server without a word, and its engine process only through Linux's parent-death signal: as Ctrl-C
        before_serving = _SignalsBeforeServing()
        previous_sigterm = signal.signal(signal.SIGTERM, _terminated_while_loading)
        try:
            info = engine.start()
            tokenizer = load_tokenizer(Path(info.model_dir))
            for sig in (signal.SIGINT, signal.SIGTERM):  # loaded: until uvicorn's handlers, a signal is kept
                signal.signal(sig, before_serving)
        except (RuntimeError, ValueError, OSError) as exc:
            line = out_of_memory_line(options.model, exc) or f"--model {options.model}: {exc}"
            parser.exit(2, f"error: {line}\n")
        except (KeyboardInterrupt, _Terminated) as exc:  # the engine process is not waited for
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal must not interrupt the cleanup
                signal.signal(sig, signal.SIG_IGN)
            stop_kwargs = {"timeout_s": 0}
            terminated = isinstance(exc, _Terminated)
            print(f"{'terminated' if terminated else 'interrupted'} while loading the model", file=sys.stderr)
            return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
        finally:
            if signal.getsignal(signal.SIGTERM) is _terminated_while_loading:
                signal.signal(signal.SIGTERM, previous_sigterm)
        host, port = sock.getsockname()[:2]
        app = build_app(engine, tokenizer, max_request_body_bytes=args.max_request_body_bytes)
        # On shutdown, streams still open get SHUTDOWN_GRACE_S to finish, then are ended with a 503 (uvicorn would
        # wait forever; its own timeout, the last resort, cuts them mid-response).
        config = uvicorn.Config(app, log_level=args.log_level, timeout_keep_alive=30, access_log=False,
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S + SHUTDOWN_END_S)
        server = Server(config, grace_s=SHUTDOWN_GRACE_S, end_requests=functools.partial(
            app.state.end_open_requests, "the server is shutting down and ended this request before it finished"))
        display_host = f"[{host}]" if ":" in host else host

        def shut_down_on_engine_death(reason: str) -> None:
            # A server whose engine is gone can only answer 503 for ever: a supervisor restarting on exit (systemd,
            # Kubernetes) never learnt of it. Requests in flight were already answered with the engine's error.
            died.append(reason)
            server.should_exit = True

        if not args.keep_alive_on_engine_death:
            engine.on_engine_death = shut_down_on_engine_death

        before_serving.server = server  # from here a signal is the server's (it may come before uvicorn's handlers)
        if before_serving.signum is not None:  # as a signal while the model loads: one line, exit 130 or 143
            terminated = before_serving.signum == signal.SIGTERM
            print(f"{'terminated' if terminated else 'interrupted'} before the server started", file=sys.stderr)
            return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED

        async def serve() -> None:
            task = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not task.done():
                await asyncio.sleep(0.05)
            if server.started:
                print(f"{SERVING_PREFIX}http://{display_host}:{port}", flush=True)
            await task

        try:
            asyncio.run(serve())
        except KeyboardInterrupt:
            pass
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine process is stopped next (it has a timeout)
    finally:
        sock.close()
        engine.stop(**stop_kwargs)
    if died:
        print(f"error: the engine stopped ({died[0]}), so the server shut down (--keep-alive-on-engine-death keeps it "
              "up, answering 503)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
