"""pytest entry point: parse options and register modelbench's plugin objects.

Behaviour lives in small registered classes (``session.core.ModelbenchSession``,
``reporting.writer.ReportWriter``, ``session.resume.ResumePlugin``,
``scheduling.ModelbenchDist``); this module only wires them, as pytest's
``cacheprovider.pytest_configure`` registers ``LFPlugin``.

Every pytest session in the environment loads this module, most of them without a
benchmark item, so at start-up it imports only the options. The session and everything
behind it are imported and registered when the options select benchmark items (``--model``,
``--mb-config``; ``--mb-dist``), or when a test asks for ``mb_item``/``mb_eval``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Generator, Iterator, Sequence
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

# the simulated server's mb_sim_server fixture: a plugin of this one, so -p no:modelbench
# disables it too
pytest_plugins = ["pytest_modelbench.testing.fixtures"]


class InstalledBytecode:
    """Finds this package's modules before pytest's assertion-rewriting hook does, so that
    they load as any installed package's do: from the byte-code pip compiled at install.

    pytest rewrites the assertions of every module of a distribution with a ``pytest11``
    entry point, and caches the rewritten code only where Python may write byte-code. With
    ``PYTHONDONTWRITEBYTECODE=1`` (CI images set it) a session parsed and compiled again
    each of the ~110 modules an item imports, about 0.3 s of every run. Their assertions are
    internal invariants that no user's test reads. The modules pytest imports as plugins
    by name (``pytest_plugins``) are left to its hook, which would otherwise warn that it
    could not rewrite them when an in-process ``pytester`` session registers them again.
    """

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not name.startswith("pytest_modelbench.") or name in pytest_plugins:
            return None
        return PathFinder.find_spec(name, path, target)


if not any(isinstance(finder, InstalledBytecode) for finder in sys.meta_path):
    sys.meta_path.insert(0, InstalledBytecode())

# E402: the package's other modules are imported once the finder above is in place
from pytest_modelbench import hookspecs  # noqa: E402
from pytest_modelbench.config.options import (  # noqa: E402
    ALIASES_KEY,
    ReportOptions,
    RunOptions,
    add_aliases,
    add_options,
    flag_name,
    without_free_aliases,
)
from pytest_modelbench.errors import EvaluationError, ModelbenchUsageError  # noqa: E402
from pytest_modelbench.workers import is_worker  # noqa: E402

if TYPE_CHECKING:  # imported where used, lazily, for pytest's start-up time
    from pytest_modelbench.backends.protocol import Backend
    from pytest_modelbench.planning.item import PlannedItem
    from pytest_modelbench.session.core import ModelbenchSession
    from pytest_modelbench.store.result import EvalResult


SESSION_PLUGIN = "modelbench-session"  # the registered ModelbenchSession, once started
OPTIONS_KEY = pytest.StashKey[tuple[RunOptions, ReportOptions]]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    """Add the short aliases (``--model``) once every plugin and initial conftest has added
    its options, just before pytest parses the command line: a neighbour's ``--env`` stays
    theirs, and ours is ``--mb-env`` then.

    Before the conftests load, the paths pytest looks for them in are read as if the aliases
    existed, so ``--run-id ..`` or ``--env gsm8k`` is not taken for a directory of tests."""
    if ALIASES_KEY not in early_config.stash:
        try:
            paths = parser.parse_known_args(without_free_aliases(parser, args)).file_or_dir
        except Exception:  # a bad command line: pytest reports it itself, later
            paths = None
        if paths is not None:
            early_config.known_args_namespace.file_or_dir = paths
    try:
        yield
    finally:
        if ALIASES_KEY not in early_config.stash:
            early_config.stash[ALIASES_KEY] = add_aliases(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "modelbench(model=None, env=None, variant=None): restrict which items a test using "
        "mb_eval is parametrized with (names or lists of names)",
    )
    try:
        options = RunOptions.from_config(config)
        report_options = ReportOptions.from_config(config)
    except ModelbenchUsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[OPTIONS_KEY] = (options, report_options)
    if options.allow_weak_sandbox:
        # lazily: the sandbox loads only when the flag is given (pytest start-up)
        from pytest_modelbench.sandbox import allow_weak_sandbox

        allow_weak_sandbox()
    if options.selects_items or options.dist is not None:
        start_session(config)


def start_session(config: pytest.Config) -> ModelbenchSession:
    """Create and register the session and its plugins (once per process)."""
    started = config.pluginmanager.get_plugin(SESSION_PLUGIN)
    if started is not None:
        session: ModelbenchSession = started
        return session
    # lazily: sessions without benchmark items never load these (pytest start-up)
    from pytest_modelbench import scheduling
    from pytest_modelbench.session.core import SESSION_KEY, ModelbenchSession
    from pytest_modelbench.session.resume import register as register_resume

    options, report_options = config.stash[OPTIONS_KEY]
    session = ModelbenchSession(config, options)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, SESSION_PLUGIN)
    if session.active:
        # lazily: only sessions with benchmark items report (pytest start-up)
        from pytest_modelbench.reporting.writer import register as register_reports

        register_reports(config, report_options, session)  # live progress, pytest-html, reports
        if report_options.trackers and not is_worker(config):
            # lazily: only sessions that log to W&B/MLflow load the trackers (pytest start-up)
            from pytest_modelbench.reporting.trackers import register as register_trackers

            register_trackers(
                config,
                report_options.trackers,
                report_options.tracker_project,
                lambda: session.run_dir.name,
                session.tracker_config,
                lambda: session.records,
            )
    scheduling.register(config, options.dist, lambda: session.active, session.plan_costs)
    register_resume(config)  # crash-proof --lf, item duration memory, --restart check
    if session.active and is_worker(config):
        # lazily: only xdist workers of benchmark sessions watch their controller
        from pytest_modelbench.session.controller_watch import register as watch_controller

        watch_controller(config)  # a kill -9 of the controller stops this worker's item
    return session


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """One line in a benchmark session when a short alias belongs to another plugin."""
    config = session.config
    aliases = config.stash.get(ALIASES_KEY, None)
    line = aliases.warning() if aliases is not None else None
    if line is None or is_worker(config) or config.pluginmanager.get_plugin(SESSION_PLUGIN) is None:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line, yellow=True)


def _parametrized_by_test(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether the test itself parametrizes ``name`` (``@pytest.mark.parametrize``)."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [part.strip() for part in names.split(",")]
        if name in names:
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test asks for benchmark items in a session whose options selected none: start the
    session now; it reports what is missing (registered during this call, it is called
    directly for this test). A test that parametrizes ``mb_item`` itself is a project's own
    test, not a benchmark item."""
    config = metafunc.config
    if (
        "mb_item" in metafunc.fixturenames
        and config.pluginmanager.get_plugin(SESSION_PLUGIN) is None
        and not _parametrized_by_test(metafunc, "mb_item")
    ):
        start_session(config).pytest_generate_tests(metafunc)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``-k`` matches a benchmark item's id as written: pytest escapes non-ASCII in node ids
    (``médqa`` → ``m\\xe9dqa``), so the id itself is added to the item's keywords."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        planned = callspec.params.get("mb_item") if callspec is not None else None
        item_id = getattr(planned, "item_id", None)
        if isinstance(item_id, str) and not item_id.isascii():
            item.extra_keyword_matches.add(item_id)


@pytest.hookimpl(trylast=True)
def pytest_modelbench_make_backend(module: str) -> Backend | None:
    # lazily: loaded only when the hook runs (pytest start-up)
    from pytest_modelbench.backends.registry import resolve_builtin

    return resolve_builtin(module)


@pytest.fixture
def mb_item(request: pytest.FixtureRequest) -> PlannedItem:
    """The planned item (model, variant, seed) of this test; parametrized by modelbench."""
    param: PlannedItem | None = getattr(request, "param", None)
    if param is None:
        flag = flag_name(request.config, "model")  # --mb-model where --model is not ours
        pytest.fail(
            f"mb_item is parametrized by pytest-modelbench; pass {flag} NAME", pytrace=False
        )
    return param


@pytest.fixture
def mb_eval(request: pytest.FixtureRequest, mb_item: PlannedItem) -> Iterator[EvalResult]:
    """The finished evaluation of this item (computed now, or read from the run store)."""
    # lazily: only tests of benchmark items get here (pytest start-up)
    from pytest_modelbench.secrets import redact

    session = start_session(request.config)
    failure: str | None = None
    try:
        result = session.evaluate(mb_item, request.node)
    except (EvaluationError, ModelbenchUsageError) as exc:
        failure = redact(str(exc))  # a server may echo the API key back in its error
        session.record_error(request.node, mb_item, failure)
    if failure is not None:  # outside the except: the report shows the message only once
        pytest.fail(failure, pytrace=False)
    yield result


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per free GPU group when this session serves models itself.

    ``tryfirst``: xdist's own implementation answers with the CPU count, and pluggy asks the
    last registered first, which depends on the order the environment loaded the plugins.

    xdist asks in ``pytest_cmdline_main``, before ``pytest_configure``: the options are
    parsed and the session started here then (``pytest_configure`` finds it started).
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` (xdist's own override) still wins: then xdist answers."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    if OPTIONS_KEY not in config.stash:
        try:
            options = (RunOptions.from_config(config), ReportOptions.from_config(config))
        except ModelbenchUsageError:
            return None  # pytest_configure reports it
        config.stash[OPTIONS_KEY] = options
        if options[0].selects_items:
            start_session(config)
    session = config.pluginmanager.get_plugin(SESSION_PLUGIN)
    if session is None or not session.active:
        return None
    try:
        items = session.plan.items
    except ModelbenchUsageError:
        return None
    served = [i for i in items if not (i.model.api_base_url or i.model.solutions)]
    if not served:
        return None
    # lazily: loaded only when the hook runs (pytest start-up)
    from pytest_modelbench.serving.gpu_discovery import GpuWarning
    from pytest_modelbench.serving.gpus import auto_num_workers

    per_server = max((i.model.serve.gpus if i.model.serve else 1) for i in served)
    with warnings.catch_warnings():  # a busy GPU: each worker's claim says so in the summary
        warnings.simplefilter("ignore", GpuWarning)
        return auto_num_workers(max(1, per_server))
