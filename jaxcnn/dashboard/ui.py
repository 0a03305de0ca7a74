"""Streamlit glue shared by the dashboard pages: the DB chooser, cached reads, tables with a CSV
download, run pickers, and messages in place of tracebacks.

Reads go through ``read(name, *args)``: it calls ``jaxcnn.dashboard.data.<name>(store, *args)``
under ``st.cache_data`` keyed on the store file's path and modification stamp, so a new run in
the DB shows up on the next rerun and unchanged data is never read twice.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from jaxcnn.dashboard import data
from jaxcnn.store import Store, StoreError

DB_INPUT_KEY = "db_path"  # sidebar text input: the DB to show
SHIPPED_KEY = "use_shipped"  # sidebar toggle: show the shipped data whatever the DB holds
PICKED_KEY = "picked_runs"  # run ids picked on the Runs page (kept across pages)
DICTIONARY_ROWS = 1000  # tables this long send repeated text once per distinct value (table())


def file_stamp(path: str | os.PathLike) -> tuple:
    """Changes whenever the store (or its WAL, where recent commits live) changes."""
    stamp = []
    for suffix in ("", "-wal"):
        try:
            info = os.stat(f"{path}{suffix}")
            stamp.append((info.st_mtime_ns, info.st_size))
        except FileNotFoundError:
            stamp.append(None)
    return tuple(stamp)


@st.cache_data(show_spinner=False, max_entries=16)
def _source(db_path: str, use_shipped: bool, stamp: tuple) -> data.Source:
    return data.choose_source(db_path or None, use_shipped=use_shipped)


@st.cache_data(show_spinner="reading the profile store...", max_entries=256)
def _read(name: str, path: str, stamp: tuple, args: tuple) -> Any:
    # Read-only, and a store with dropped tables still opens: each page reports what it lacks.
    with Store(path, read_only=True, partial=True) as store:
        return getattr(data, name)(store, *args)


def read(name: str, *args: Any) -> Any:
    """data.<name>(store, *args) on the current source, cached."""
    source = current_source()
    return _read(name, str(source.path), file_stamp(source.path), args)


def sidebar() -> None:
    """The DB chooser; called by app.py on every page."""
    with st.sidebar:
        st.header("Profile store")
        if DB_INPUT_KEY not in st.session_state:
            st.session_state[DB_INPUT_KEY] = str(data.default_db_path())
        st.text_input("SQLite DB", key=DB_INPUT_KEY,
                      help="A jaxcnn store (`jaxcnn profile ... --db PATH`). Without runs in it, the "
                           "shipped GPU measurements are shown.")
        st.toggle("Show the shipped data", key=SHIPPED_KEY,
                  help="The measurements committed under dashboard/shipped/, whatever the DB holds.")
        try:
            source = current_source()
        except Exception:  # the page shows the message
            return
        if source.shipped:
            st.caption(f"Shipped data (cached in `{source.path}`)")
        else:
            st.caption(f"Reading `{source.path}`")


def current_source() -> data.Source:
    """The store to read, per the sidebar (StoreError/NoData if it cannot be used)."""
    db_path = str(st.session_state.get(DB_INPUT_KEY) or data.default_db_path())
    use_shipped = bool(st.session_state.get(SHIPPED_KEY, False))
    stamp = file_stamp(Path(db_path).expanduser())
    return _source(db_path, use_shipped, stamp)


def page_source() -> data.Source:
    """The source with a banner saying what is shown; stops the page with a message if unusable."""
    try:
        source = current_source()
    except StoreError as exc:
        st.error(f"Cannot read the profile store: {exc}. Choose another DB in the sidebar, or turn on "
                 "'Show the shipped data'.")
        st.stop()
    except data.NoData as exc:
        st.error(str(exc))
        st.stop()
    except (OSError, sqlite3.Error) as exc:
        st.error(f"Cannot read the profile store: {exc}")
        st.stop()
    if source.shipped:
        st.info(source.note)
    return source


@contextlib.contextmanager
def guard(what: str) -> Iterator[None]:
    """Run a page section; a missing-data, store or unexpected error becomes a message, never a
    traceback, and the rest of the page still renders."""
    try:
        yield
    except data.NoData as exc:
        st.info(f"{what}: no data yet. {exc}")
    except StoreError as exc:
        st.error(f"{what}: cannot read the profile store: {exc}")
    except Exception as exc:  # noqa: BLE001 - the page must not show a traceback
        st.error(f"{what}: could not be shown ({type(exc).__name__}: {exc})")


def runs() -> pd.DataFrame:
    return read("runs_table")


def pick_run(candidates: pd.DataFrame, label: str, key: str, position: int = 0,
             prefer_model: str | None = None, default: int | None = None) -> dict[str, Any] | None:
    """A selectbox over `candidates` (rows of runs_table); the default is the Runs page's pick
    number `position` when it is a candidate, else the latest candidate of `prefer_model`, else
    `default` (a candidate id), else the latest candidate."""
    if candidates.empty:
        return None
    ids = candidates["id"].astype(int).tolist()
    picked = list(st.session_state.get(PICKED_KEY, []))
    same_model = candidates.loc[candidates["model"] == prefer_model, "id"].astype(int).tolist()
    if len(picked) > position and picked[position] in ids:
        default = picked[position]
    elif same_model:
        default = same_model[-1]
    elif default not in ids:
        default = ids[-1]
    labels = dict(zip(ids, candidates["label"]))
    chosen = st.selectbox(label, ids, index=ids.index(default), format_func=lambda i: labels[i], key=key)
    return candidates[candidates["id"] == chosen].iloc[0].to_dict()


def pick_run_or_stop(candidates: pd.DataFrame, key: str, empty: str) -> dict[str, Any]:
    """A page's run picker ("Run", starting from data.default_run_id of `candidates`); with no
    candidates the page stops with the message `empty` (what to run to get data)."""
    if candidates.empty:
        st.info(empty)
        st.stop()
    return pick_run(candidates, "Run", key=key, default=data.default_run_id(candidates))


def measured() -> str:
    """The source label of the current store's measurements (data.MEASURED or data.SHIPPED)."""
    return current_source().measured


@st.cache_data(show_spinner=False, max_entries=4)
def _provenance(stamp: tuple) -> pd.DataFrame:
    return data.shipped_provenance()


def shipped_provenance() -> pd.DataFrame:
    """data.shipped_provenance(), read again when a shipped export changes."""
    return _provenance(tuple((f.name, f.stat().st_mtime_ns) for f in data.shipped_files()))


def table(frame: pd.DataFrame, name: str, *, key: str, caption: str | None = None) -> None:
    """A dataframe with a CSV download of exactly what is shown, and where its numbers come from."""
    st.dataframe(_dictionary_encoded(frame), hide_index=True, width="stretch")
    st.download_button(f"Download {name}.csv", frame.to_csv(index=False).encode(), file_name=f"{name}.csv",
                       mime="text/csv", key=f"csv-{key}", on_click="ignore")
    sources = data.sources_caption(frame, measured())
    text = " ".join(t for t in (caption, sources) if t)
    if text:
        st.caption(text)


def _dictionary_encoded(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` as the browser gets it: in a frame of DICTIONARY_ROWS rows or more, a text column
    whose values repeat (at most half as many distinct values as rows) becomes a categorical, so
    each distinct value is sent and decoded once (an Arrow dictionary) with the same cells shown.
    A plan's buffer table lists every buffer once per packing algorithm."""
    if len(frame) < DICTIONARY_ROWS:
        return frame
    repeated = {column: "category" for column in frame.columns
                if pd.api.types.is_string_dtype(frame[column]) and frame[column].nunique() <= len(frame) // 2}
    return frame.astype(repeated) if repeated else frame


def chart(spec) -> None:
    st.altair_chart(spec, width="stretch")


def fmt_ms(value: float) -> str:
    return "n/a" if value is None or pd.isna(value) else f"{value:.4g} ms"


def fmt_mib(value: float) -> str:
    """MiB with 3 decimals below 100 MiB, 1 above (GiB-sized arenas must fit a metric column)."""
    if value is None or pd.isna(value):
        return "n/a"
    return f"{value:.1f} MiB" if abs(value) >= 100 else f"{value:.3f} MiB"
