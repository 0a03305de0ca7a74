"""The dashboard's logic, kept out of the Streamlit scripts so it can be tested without a server.

    data    -- the one import for the pages: which store to show (a local DB or the shipped
               data) and pandas frames read from it, re-exported from sources (store choice,
               shipped data, value sources), runs_data, speed_data (per-layer speed, compare,
               roofline), memory_data (memory stats and plans) and sparsity_data;
    charts  -- small pure functions from those frames to Altair charts (specs tests inspect);
    ui      -- the Streamlit glue the pages share: cached reads, the DB chooser, tables with
               CSV download, error messages instead of tracebacks.

The app itself is dashboard/app.py (`streamlit run dashboard/app.py` or `jaxcnn dashboard`).
"""
